"""A1111's `/progress` from the job registry's running job (the web UI's or an API client's: one GPU, one job).

`progress` is the fraction of the job's steps done (at least 0.01 once a job runs, as A1111's), `eta_relative`
the seconds left at the rate so far, `state` A1111's state dict (sampling_step of sampling_steps, interrupted),
`textinfo` what the job is doing while no step has ended yet. `current_image` is None: jobs make no previews
yet.
"""

from __future__ import annotations

import time

IDLE_STATE = {"skipped": False, "interrupted": False, "stopping_generation": False, "job": "", "job_count": 0,
              "job_timestamp": "0", "job_no": 0, "sampling_step": 0, "sampling_steps": 0}


def progress(job) -> dict:
    """The answer for the running `job` (a ui.jobs.Job; None: nothing runs)."""
    if job is None:
        return {"progress": 0.0, "eta_relative": 0.0, "state": dict(IDLE_STATE), "current_image": None,
                "textinfo": None}
    step, total, started = job.step, job.total, job.started
    done = step / total if total else 0.0
    fraction = min(max(done, 0.01), 1.0)
    elapsed = max(time.time() - started, 0.0)
    state = dict(IDLE_STATE, interrupted=job.cancel.is_set(), job_count=1,
                 job_timestamp=time.strftime("%Y%m%d%H%M%S", time.localtime(started)), sampling_step=step,
                 sampling_steps=total)
    return {"progress": fraction, "eta_relative": elapsed / fraction - elapsed if done else 0.0, "state": state,
            "current_image": None,
            "textinfo": None if step else "waiting for the GPU, or loading the model"}
