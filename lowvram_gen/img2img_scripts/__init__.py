"""A1111's img2img scripts that run as several img2img jobs: Loopback (loopback.py) and SD upscale (sd_upscale.py).

Each is a pure function over (request, the script's arguments, `run_one`): `run_one(request)` runs one
GenerationRequest through the caller's one job runner (the CLI's Session.generate, the web UI's and the API's
jobs/run.py) and returns its GenerationResult, so every pass or tile is an ordinary job with its own plan and
out-of-memory ladder. `SCRIPTS` (scripts.py) holds each script's descriptor for the Script dropdown and the API's
`script_name`/`script_args`.
"""
