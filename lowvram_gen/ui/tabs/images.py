"""The img2img and Upscale tabs. img2img shares the txt2img job runner (queue, progress, cancel)."""

import html

import gradio as gr

from lowvram_gen.errors import LowVramError
from lowvram_gen.models.discover import model_choices
from lowvram_gen.request import MAX_BATCH, MAX_CFG, MAX_SEED, MAX_STEPS
from lowvram_gen.samplers import DEFAULT, SAMPLERS
from lowvram_gen.upscale.command import MAX_SCALE
from lowvram_gen.upscale.upscalers import available

GPU = "gpu"


def upscaler_choices(hires: bool = False) -> list[str]:
    return [u for u in available() if hires or u != "latent"]


def build_img2img_tab(run_job, cancel, options) -> None:
    def img2img(init_image, prompt, negative_prompt=None, strength=0.75, width=512, height=512, steps=20,
                cfg_scale=7.0, seed=-1, batch_size=1, sampler=DEFAULT, model=None,
                request: gr.Request = None, progress=gr.Progress()):
        if not init_image:
            raise gr.Error("choose an init image first")
        yield run_job(dict(prompt=prompt, negative_prompt=negative_prompt or "", init_image=init_image,
                           strength=strength, width=width, height=height, steps=steps, cfg_scale=cfg_scale,
                           seed=seed, batch_size=batch_size, sampler=sampler or DEFAULT,
                           model=model or options.model), request, progress)

    def size_from(init_image):
        from PIL import Image

        if not init_image:
            return gr.update(), gr.update()
        with Image.open(init_image) as im:
            return im.width // 8 * 8, im.height // 8 * 8

    with gr.Tab("img2img"):
        with gr.Row():
            with gr.Column(scale=3):
                init = gr.Image(label="Init image", type="filepath", elem_id="i2i-init")
                prompt = gr.Textbox(label="Prompt", lines=2, elem_id="i2i-prompt")
                negative = gr.Textbox(label="Negative prompt", lines=1)
                strength = gr.Slider(0, 1, value=0.75, step=0.01, label="Denoising strength (0 keeps the image)")
                with gr.Row():
                    width = gr.Number(label="Width", value=512, precision=0)
                    height = gr.Number(label="Height", value=512, precision=0)
                    batch = gr.Slider(1, MAX_BATCH, value=1, step=1, label="Batch size")
                with gr.Row():
                    steps = gr.Slider(1, MAX_STEPS, value=20, step=1, label="Steps")
                    cfg = gr.Slider(0, MAX_CFG, value=7, step=0.5, label="CFG scale")
                with gr.Row():
                    seed = gr.Number(label="Seed (-1: random)", value=-1, precision=0, minimum=-1, maximum=MAX_SEED)
                    sampler = gr.Dropdown([DEFAULT, *SAMPLERS], value=DEFAULT, label="Sampler")
                    model = gr.Dropdown(model_choices(options.models_folder), value=options.model,
                                        allow_custom_value=True, label="Model")
                with gr.Row():
                    go = gr.Button("Generate", variant="primary", elem_id="i2i-generate")
                    stop = gr.Button("Cancel", variant="stop")
            with gr.Column(scale=2):
                gallery = gr.Gallery(label="Results", columns=2, format="png")
                info = gr.Textbox(label="Image parameters", lines=4, interactive=False)
                summary = gr.Textbox(label="What ran", lines=2, interactive=False)
                last_seed = gr.Number(visible=False, precision=0)
    init.change(size_from, [init], [width, height], queue=False, api_visibility="private")
    go.click(img2img, [init, prompt, negative, strength, width, height, steps, cfg, seed, batch, sampler, model],
             [gallery, info, summary, last_seed], api_name="img2img", concurrency_id=GPU, concurrency_limit=1)
    stop.click(cancel, None, [summary], queue=False, api_visibility="private")


def build_upscale_tab(session) -> None:
    def upscale(image, scale=2.0, upscaler="lanczos"):
        from lowvram_gen.upscale.command import run_upscale

        if not image:
            raise gr.Error("choose an image first")
        with session.lock:  # the GPU is shared with generation: one job at a time
            try:
                result = run_upscale(image, scale, upscaler, session.outdir, session.device().torch_device)
            except LowVramError as exc:
                raise gr.Error(html.escape(str(exc))) from None
        return result["images"][0], html.escape(result["summary"])

    with gr.Tab("Upscale"):
        with gr.Row():
            with gr.Column():
                image = gr.Image(label="Image", type="filepath")
                scale = gr.Slider(1, MAX_SCALE, value=2, step=0.25, label="Scale")
                upscaler = gr.Dropdown(upscaler_choices(), value="lanczos", allow_custom_value=True,
                                       label="Upscaler (or a path to an ESRGAN-family model)")
                go = gr.Button("Upscale", variant="primary")
            with gr.Column():
                result = gr.Image(label="Result", type="filepath", format="png")
                summary = gr.Textbox(label="What ran", interactive=False)
    go.click(upscale, [image, scale, upscaler], [result, summary], api_name="upscale", concurrency_id=GPU,
             concurrency_limit=1)
