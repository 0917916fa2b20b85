"""A1111's vocabulary in one place: its field names (request field <-> PNG infotext label <-> API JSON key <->
batch-line alias, with one policy each) and what reads and writes them.

- `fields`: the table of field specs, the one place A1111's names are written;
- `infotext`: the PNG `parameters` text written from a request and read back into request fields;
- `api_body`: A1111's txt2img/img2img JSON body as a request;
- `controlnet_units`: the ControlNet extension's API units (alwayson_scripts, batch lines) as request units;
- `upscaler_names`: A1111's upscaler names and the check of a name;
- `sigmas`: the noise levels of A1111's schedule types (numpy), which schedules.hand_over gives the schedulers.

Nothing is imported here, so the request (request.py) can read `fields` and `upscaler_names` without the rest.
"""
