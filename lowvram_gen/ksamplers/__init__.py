"""A1111's k-diffusion samplers that diffusers has no scheduler for, as diffusers schedulers (SchedulerMixin)."""
