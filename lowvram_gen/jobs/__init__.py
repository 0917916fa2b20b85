"""Jobs of the web server, and their console: what the web UI and A1111's REST API share to run a request.

- `registry`: a `Job` (a request run in a worker thread: its steps, live preview, Interrupt and Skip) and the
  `Registry` of every client's running job (so A1111's global /interrupt, /skip and /progress reach any of them)
- `run`: `run()`, the one way a front end runs a registered job (console lines, progress bar, queueing, errors)
- `progress`: the one progress line a front end shows of a job (queue position, step, batch, ETA)
- `console`: what the console says of a job (one line when it starts and ends, a tqdm bar of its steps)

Importing this package loads neither gradio, FastAPI nor torch.
"""
