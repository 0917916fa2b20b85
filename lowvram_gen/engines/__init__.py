"""Engines apply a plan to a loaded model and run one stage of a job (denoise, decode)."""
