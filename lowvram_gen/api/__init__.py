"""A1111's REST API (`/sdapi/v1/...`) over the same Session, job registry and memory layer as the web UI.

`lowvram-gen ui --api` adds these routes to the app gradio serves (as A1111 adds them to the app its
launch returns); `--nowebui` serves them alone. The tools people drive A1111 and Forge with (the
`webuiapi` client, Krita and Photoshop plugins, chat front ends) speak this API.

- `fields`: A1111's JSON body -> one validated `GenerationRequest` (and the warnings for what is not used)
- `answers`: the answers' shapes: base64 images, `parameters`, the `info` JSON string, A1111's error bodies
- `listings`: sd-models, samplers, schedulers, loras, embeddings, upscalers; a checkpoint title -> a model
- `state`: what `/options` reads and sets (the API's model and clip skip)
- `progress`: `/progress` from the registry's running job
- `controlnet`: the ControlNet extension's routes (/controlnet/model_list, module_list, version, detect)
- `routes`: the FastAPI routes, their HTTP Basic auth and the per-request log
- `video`: `POST /lowvram/v1/video` (our own prefix: A1111 has no video route; docs/api-video.md)
- `serve`: mounting on gradio's app, or an API-only server (`--nowebui`)

Importing this package (or fields, answers, listings, state, progress, controlnet) loads neither gradio, FastAPI
nor torch; `routes` and `serve` load FastAPI, and only the server launcher (lowvram_gen/server.py) imports them, when
the API is on. Jobs run through `lowvram_gen.jobs`, as the web UI's do; nothing here imports the UI or the CLI.
"""
