"""The System tab: the device and what is loaded, the VRAM budget and reserve, free VRAM, the plan for the
current txt2img request (every preset's estimate, the cpu preset's too when the CPU runs it; its enabled ControlNet
units counted, as `plan --controlnet` counts them), the presets,
and the remembered out-of-memory failures of this machine's GPU (never the CPU's: those were simulated).

Everything here goes through Session methods; the sliders show the session's values on every page load.
"""

import dataclasses
import html
import math

import gradio as gr

from lowvram_gen import failures
from lowvram_gen.hardware.device import GiB, format_size
from lowvram_gen.errors import LowVramError
from lowvram_gen.request import GenerationRequest
from lowvram_gen.samplers import DEFAULT
from lowvram_gen.ui import controlnet, messages
from lowvram_gen.ui.context import GPU, TabContext
from lowvram_gen.ui.widgets import AS_PRESET, quantize_field

BUDGET_MAX_GIB, RESERVE_MAX_GIB = 80, 8  # slider ranges; a bigger value from the command line widens them


def _pixels(n: int) -> str:
    """A preset's pixel cap as people say it: 1024x1024 for a square's worth."""
    side = math.isqrt(n)
    return f"{side}x{side}" if side * side == n else f"{n:,} px"


def _timing(timing: dict) -> str:
    return f"measured ({timing['jobs']})" if timing.get("source") == "measured" else "assumed"


def free_memory_text(session, device_text) -> str:
    """Unload every model; say which, and how much memory came back (VRAM on a GPU, system RAM on a CPU)."""
    from lowvram_gen.hardware import hostmem
    from lowvram_gen.oom import allocated_bytes

    kind = session.device().kind
    used = (lambda: allocated_bytes(kind)) if kind != "cpu" else hostmem.process_rss
    loaded = session.loaded_model_name()
    before = used()
    session.free()
    freed = max(0, before - used())
    memory = "VRAM" if kind != "cpu" else "system RAM"
    what = f"unloaded `{html.escape(loaded)}`" if loaded else "no model was loaded"
    return f"{device_text()}\n\n**Freed**: {what}; {format_size(freed)} of {memory} given back."


def with_unit_models(job: GenerationRequest, units) -> GenerationRequest:
    """`job` (validated) with txt2img's enabled ControlNet units, each checked as a job checks it but without its
    control image: the plan counts a unit's model, not its image, so a unit waiting for its image is counted too."""
    from lowvram_gen.control.units import check_units
    from lowvram_gen.request import check_image_path

    return dataclasses.replace(job, controlnets=check_units(units, check_image_path, image_required=False))


def controlnet_text(job: GenerationRequest, chosen) -> str:
    """What the plan counted of the units' ControlNets (as `plan --controlnet` says it): their weights as the chosen
    candidate stores them, on the GPU for the whole denoise, and streamed each step."""
    if not job.controlnets or chosen is None:
        return ""
    b = chosen.breakdown
    names = ", ".join(dict.fromkeys(f"`{html.escape(u.model)}`" for u in job.controlnets))
    return (f"\n\n**ControlNet** counted with the denoiser: {names}: "
            f"{format_size(b.get('controlnet_bytes', 0))} as {html.escape(chosen.name)} stores them "
            f"({format_size(b.get('controlnet_resident_bytes', 0))} on the device while it denoises, "
            f"{format_size(b.get('controlnet_streamed_bytes_per_step', 0))} streamed a step).")


def failures_table() -> list[list]:
    """Remembered GPU failures; a CPU's (simulated, or from a version that remembered them) are not shown."""
    return [[r["device"], r["model"], r["preset"], r["pixels"], r["batch"]] for r in failures.load()
            if not failures.on_cpu(str(r.get("device")))]


def build(ctx: TabContext) -> None:
    session, options = ctx.session, ctx.options

    def device_text():
        from lowvram_gen.oom import allocated_bytes

        d = session.device()
        used = allocated_bytes(d.kind)
        mem = (f"total {format_size(d.total_bytes)}, free {format_size(d.free_bytes)}, "
               f"usable {format_size(d.usable_bytes)}" if d.is_accelerator else "system RAM (no GPU)")
        loaded = session.loaded_model_name() or "none"
        ram = f" System RAM: {html.escape(d.host.describe())}." if d.host is not None else ""
        return (f"**{html.escape(d.name)}** ({d.kind}): {mem}. In use by lowvram-gen: {format_size(used)}. "
                f"Loaded model: `{html.escape(loaded)}`.{ram}")

    def limits():
        """The sliders' values (GiB) from the session: what the next job applies."""
        budget, reserve = session.vram_limits()
        budget_gib, reserve_gib = (budget or 0) / GiB, reserve / GiB
        return (gr.update(value=budget_gib, maximum=max(BUDGET_MAX_GIB, budget_gib)),
                gr.update(value=reserve_gib, maximum=max(RESERVE_MAX_GIB, reserve_gib)))

    def set_memory(budget_gib, reserve_gib):
        session.set_vram_limits(int(budget_gib * GiB) if budget_gib else None, int((reserve_gib or 0) * GiB))
        return device_text()

    def plan_table(prompt, negative_prompt, width, height, steps, cfg_scale, seed, batch_size, sampler, model,
                   quantize=AS_PRESET, *units, request: gr.Request = None):
        try:
            job = GenerationRequest(prompt=prompt, width=width, height=height, steps=steps, cfg_scale=cfg_scale,
                                    seed=seed, batch_size=batch_size, sampler=sampler or DEFAULT,
                                    model=model or options.model, quantize=quantize_field(quantize)).validated()
            job = with_unit_models(job, controlnet.request_fields(units)["controlnets"])
            result = session.plan(job)
        except LowVramError as exc:
            raise messages.error(exc, request) from None
        cpu = {p.name for p in session.presets().values() if p.device == "cpu"}
        chosen = result.preset.name
        ordered = sorted(result.estimates, key=lambda e: (e.name != chosen, not (e.fits and e.fits_host)))
        rows = [[e.name, format_size(e.estimate_bytes), "system RAM" if e.name.split("+")[0] in cpu else
                 "yes" if e.fits else "no", format_size(e.host_peak_bytes), "yes" if e.fits_host else "no",
                 f"{e.est_seconds_per_step:.3g}", _timing(e.timing), f"{e.width}x{e.height}", e.batch,
                 e.skipped_reason] for e in ordered]
        counted = controlnet_text(job, next((e for e in result.estimates if e.name == chosen), None))
        if result.refusal:
            return rows, f"Would not run: {html.escape(messages.for_ui(result.refusal))}{counted}"
        return rows, f"Would run: **{result.preset.name}** ({html.escape(messages.for_ui(result.reason))}){counted}"

    def presets_table():
        rows = []
        for p in session.presets().values():
            m = p.memory
            rows.append([p.name, p.rank, p.device, m.dtype, m.attention, m.offload, m.vae_slicing, m.vae_tiling,
                         m.fp8_storage, _pixels(p.max_pixels), p.max_batch, p.description])
        forced = session.forced_preset()
        return rows, (f"Starting preset (from the command line): **{forced.name}**" if forced
                      else "Starting preset: chosen by the planner for each job")

    def forget_failures():
        failures.forget()
        return failures_table()

    def free_vram():
        return free_memory_text(session, device_text)

    with gr.Tab("System"):
        device_md = gr.Markdown(elem_id="device")
        budget_gib, reserve_gib = ((session.vram_limits()[0] or 0) / GiB, session.vram_limits()[1] / GiB)
        on_gpu = session.device().is_accelerator
        gpu_only = {} if on_gpu else {"interactive": False, "info": "no GPU here: this applies to a GPU's memory"}
        with gr.Row():
            budget = gr.Slider(0, max(BUDGET_MAX_GIB, budget_gib), value=budget_gib, step=0.5,
                               label="VRAM budget, GiB (0: no cap)", elem_id="budget", **gpu_only)
            reserve = gr.Slider(0, max(RESERVE_MAX_GIB, reserve_gib), value=reserve_gib, step=0.1,
                                label="Reserve for other programs, GiB", elem_id="reserve", **gpu_only)
        free = gr.Button("Free memory (unload the model)", elem_id="free")  # VRAM and RAM: one label, any machine
        gr.Markdown("### Plan for the current txt2img request (with its enabled ControlNet units)")
        plan_btn = gr.Button("Estimate", elem_id="estimate")
        plan_md = gr.Markdown(elem_id="plan")
        plan_df = gr.Dataframe(headers=["preset", "VRAM estimate", "fits VRAM", "RAM estimate", "fits RAM", "s/step",
                                        "timing", "size", "batch", "skipped"],
                               interactive=False, elem_id="plan-table")
        gr.Markdown("### Presets")
        forced_md = gr.Markdown()
        presets_df = gr.Dataframe(headers=["name", "rank", "device", "dtype", "attention", "offload",
                                           "vae slicing", "vae tiling", "fp8", "max pixels", "max batch",
                                           "description"], interactive=False)
        gr.Markdown("### Remembered out-of-memory failures (GPU)")
        failures_df = gr.Dataframe(headers=["device", "model", "preset", "pixels", "batch"], interactive=False,
                                   elem_id="failures")
        forget = gr.Button("Forget them")
        timer = gr.Timer(3.0)
    timer.tick(device_text, None, [device_md], queue=False, api_visibility="private", show_progress="hidden")
    for slider in (budget, reserve):  # release: a drag's end or leaving the box; input: typing (Enter alone
        for event in (slider.release, slider.input):  # used to set nothing: release waits for the blur)
            event(set_memory, [budget, reserve], [device_md], api_visibility="private", trigger_mode="always_last",
                  show_progress="hidden")
    free.click(free_vram, None, [device_md], concurrency_id=GPU, concurrency_limit=1, api_visibility="private")
    # the ControlNet units last (ui/controlnet.py appended), after the older inputs
    plan_btn.click(controlnet.appended(plan_table), [*ctx.txt2img_inputs, ctx.controls["txt2img"]["quantize"],
                                                     *(ctx.controls["txt2img"][k] for k in controlnet.KEYS)],
                   [plan_df, plan_md], api_visibility="private")
    forget.click(forget_failures, None, [failures_df], api_visibility="private")
    ctx.app.load(lambda: (device_text(), *limits(), *presets_table(), failures_table()), None,
                 [device_md, budget, reserve, presets_df, forced_md, failures_df], api_visibility="private")
