"""The img2img scripts' descriptors: A1111's titles and `script_args` orders, for the Script dropdown and the API.

A1111's API takes `script_name` (the title, any case) and `script_args`, the script's UI values in order:
Loopback [loops, final denoising strength, denoising curve, append interrogated prompt]; SD upscale [the info
text (unused), tile overlap, upscaler (an index into its list, or a name), scale factor]. A short list takes the
defaults (A1111's UI's) for the rest.
"""

from __future__ import annotations

from lowvram_gen.errors import InvalidRequest
from lowvram_gen.img2img_scripts import loopback, sd_upscale
from lowvram_gen.img2img_scripts.base import ScriptArg, ScriptDescriptor


def _mapper(title: str, args: tuple[ScriptArg, ...], used: tuple[str, ...]):
    def args_from_script_args(values) -> dict:
        values = list(values or [])
        if len(values) > len(args):
            raise InvalidRequest("script_args", values, f"{title} takes at most {len(args)}: "
                                                        f"{', '.join(a.label for a in args)}")
        given = {a.name: (values[i] if i < len(values) and values[i] is not None else a.default)
                 for i, a in enumerate(args)}
        return {name: given[name] for name in used}

    return args_from_script_args


LOOPBACK_ARGS = (ScriptArg("loops", "Loops", 4), ScriptArg("final_denoising_strength", "Final denoising strength", 0.5),
                 ScriptArg("denoising_curve", "Denoising strength curve", "Linear"),
                 ScriptArg("append_interrogation", "Append interrogated prompt at each iteration", "None"))
SD_UPSCALE_ARGS = (ScriptArg("info", "(info text)", ""), ScriptArg("overlap", "Tile overlap", 64),
                   ScriptArg("upscaler", "Upscaler", 0),  # index 0: A1111's first, None
                   ScriptArg("scale_factor", "Scale Factor", 2.0))

LOOPBACK = ScriptDescriptor(loopback.TITLE, LOOPBACK_ARGS,
                            _mapper(loopback.TITLE, LOOPBACK_ARGS, tuple(a.name for a in LOOPBACK_ARGS)),
                            loopback.run_loopback)
SD_UPSCALE = ScriptDescriptor(sd_upscale.TITLE, SD_UPSCALE_ARGS,
                              _mapper(sd_upscale.TITLE, SD_UPSCALE_ARGS, ("overlap", "upscaler", "scale_factor")),
                              sd_upscale.run_sd_upscale)
SCRIPTS = {d.title.lower(): d for d in (LOOPBACK, SD_UPSCALE)}  # by A1111's title, lower case


def find(title: str) -> ScriptDescriptor | None:
    """The img2img script of A1111's title `title` (any case); None for another."""
    return SCRIPTS.get(str(title or "").strip().lower())


def run(descriptor: ScriptDescriptor, request, session, *, run_one, on_part=None, outdir: str | None = None,
        cpu: bool = False, **kwargs):
    """Run `descriptor`'s script over `request` (each job through `run_one`), every front's one door: SD upscale's
    upscaler model runs on the session's device (the CPU with `cpu`), its assembled images go to `outdir`."""
    if descriptor is SD_UPSCALE:
        kwargs.update(outdir=outdir, device="cpu" if cpu else session.device().torch_device)
    return descriptor.run(request, run_one, on_part=on_part, **kwargs)
