"""A1111's `/progress` from the job registry's running job (the web UI's or an API client's: one GPU, one job).

`progress` is the fraction of the running pass's steps done (at least 0.01 once a job runs, as A1111's; with a
batch count each batch is a pass), `eta_relative` the seconds left at the rate so far, `state` A1111's state dict
(sampling_step of sampling_steps, interrupted, skipped), `current_image` the job's latest live preview as a base64
PNG (None before the first, or with skip_current_image), `textinfo` the job's one progress line (jobs/progress.py:
"Waiting: 1 job ahead", "Step 2/20 · batch 1/2 · ETA 0:09", as the web UI shows it).
"""

from __future__ import annotations

import base64
import io
import time

IDLE_STATE = {"skipped": False, "interrupted": False, "stopping_generation": False, "job": "", "job_count": 0,
              "job_timestamp": "0", "job_no": 0, "sampling_step": 0, "sampling_steps": 0}


def progress(job, skip_current_image: bool = False) -> dict:
    """The answer for the running `job` (a jobs.registry.Job; None: nothing runs)."""
    if job is None:
        return {"progress": 0.0, "eta_relative": 0.0, "state": dict(IDLE_STATE), "current_image": None,
                "textinfo": None}
    step, total, started = job.step, job.total, job.started
    done = step / total if total else 0.0
    fraction = min(max(done, 0.01), 1.0)
    elapsed = max(time.time() - started, 0.0)
    state = dict(IDLE_STATE, skipped=job.skip.is_set(), interrupted=job.cancel.is_set(), job_count=1,
                 job_timestamp=time.strftime("%Y%m%d%H%M%S", time.localtime(started)), sampling_step=step,
                 sampling_steps=total)
    return {"progress": fraction, "eta_relative": elapsed / fraction - elapsed if done else 0.0, "state": state,
            "current_image": None if skip_current_image or job.preview is None else png_base64(job.preview),
            "textinfo": job.line or (None if step else "waiting for the GPU, or loading the model")}


def png_base64(image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")
