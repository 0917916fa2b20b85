"""The shape of one model family's record (`Family`), and the small enums and sub-records it holds.

A record is plain data plus a few small functions: how the family is recognised (pipeline classes, a
single file's keys, the denoiser's class), its names (hub id, aliases, labels), the shapes the memory
planner reads from its configs, its text encoders' token lengths, host-RAM and ControlNet facts, and what
the execution side needs (latent format for previews, how its call takes CFG and a negative prompt, its
tasks and their pipeline classes, what clip skip / variation seeds / text-encoder reload / LoRA mean for it).
The records themselves are in families/records.py; the lookups in families/registry.py. Nothing here
imports torch, diffusers or anything above models/ at import time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Mapping


class Guidance(str, Enum):
    """How a family's pipeline call takes the CFG scale (`--cfg`)."""

    CFG = "guidance_scale"  # classic classifier-free guidance: guidance_scale, the denoiser batch doubled
    TRUE_CFG = "true_cfg_scale"  # CFG named true_cfg_scale (Qwen-Image): two forwards, not a doubled batch
    DISTILLED = "distilled"  # guidance_scale is an input of a guidance-distilled denoiser (FLUX.1-dev): no CFG
    NONE = "none"  # the call takes no guidance at all


class Task(str, Enum):
    """What a family's pipelines can do; `Family.tasks` maps each it has to its diffusers pipeline class."""

    TXT2IMG = "txt2img"
    IMG2IMG = "img2img"
    INPAINT = "inpaint"
    CONTROLNET = "controlnet"
    CONTROLNET_IMG2IMG = "controlnet_img2img"
    CONTROLNET_INPAINT = "controlnet_inpaint"
    EDIT = "edit"
    TXT2VID = "txt2vid"  # a video from a prompt (`lowvram-gen video`)
    IMG2VID = "img2vid"  # a video from a prompt and its first frame (`lowvram-gen video --init-image`)


@dataclass(frozen=True)
class Call:
    """How the family's pipeline __call__ takes guidance and a negative prompt."""

    guidance: Guidance = Guidance.CFG
    # a negative prompt acts as we call the pipeline (False for FLUX.1: only with true CFG, which we never turn on)
    negative_prompt: bool = True
    # __call__ has a `negative_prompt` argument at all (FLUX.1 has, for its optional true CFG; Flux.2 and SANA not)
    takes_negative_prompt: bool = True
    # __call__ offers an optional true CFG (`true_cfg_scale` > 1 with a negative prompt: FLUX.1)
    optional_true_cfg: bool = False
    # what the call is given as its negative prompt when the user gave none (None: `negative_prompt=None`, the
    # pipeline's own fallback). SANA's call crashes on None ('NoneType' object has no attribute 'lower'): ""
    empty_negative: str | None = None
    # the negative prompt the call gets when CFG is on and the user gave none (None: none). Qwen-Image's true CFG runs
    # only with a negative prompt; its model card passes " " so that `--cfg` acts without one
    blank_negative: str | None = None

    @property
    def cfg_argument(self) -> str | None:
        """The __call__ argument `--cfg` goes to (None: the call takes no guidance)."""
        return {Guidance.CFG: "guidance_scale", Guidance.TRUE_CFG: "true_cfg_scale",
                Guidance.DISTILLED: "guidance_scale", Guidance.NONE: None}[self.guidance]


@dataclass(frozen=True)
class FolderFacts:
    """What a model folder says about which variant of a family it is, for its sampling defaults: its name as the
    user gave it (a hub id's repo name, a folder's or a file's own name, lower case), model_index.json, and its
    transformer's config. Empty where there is nothing to read (a single file without --config)."""

    name: str = ""
    model_index: Mapping = field(default_factory=dict)
    transformer: Mapping = field(default_factory=dict)


@dataclass(frozen=True)
class Sampling:
    """The steps and CFG scale a family runs when the user gives none: what its users expect (its model card)."""

    steps: int = 20  # A1111's txt2img default
    cfg: float = 7.0  # A1111's txt2img default (for a distilled-guidance family: its guidance input)
    source: str = "A1111's defaults"  # where the numbers come from, for messages and the record's readers


A1111_SAMPLING = Sampling()


@dataclass(frozen=True)
class Edit:
    """How a family's edit pipeline (Task.EDIT) takes its reference images: the images to edit or to take from."""

    argument: str = "image"  # the __call__ argument the reference images go to
    max_images: int = 1  # how many one call takes (a list; one image where it is 1)
    # the pixels the pipeline resizes each reference image to before its VAE encodes it: 'area' (always to about
    # `pixels`, the image's aspect kept: Qwen-Image-Edit, Kontext's preferred sizes), 'cap' (only one above `pixels`
    # is made smaller: Flux.2); what the plan counts as the references' latent tokens
    resize: str = "area"
    pixels: int = 1024 * 1024
    needs_image: bool = True  # its call fails without a reference image (txt2img is refused in one sentence)
    # its text encoder reads the reference images too (Qwen2.5-VL): the prompts cannot be encoded apart from them
    text_reads_images: bool = False
    # the call argument that rescales the asked size to this area (Kontext's `max_area`; its call runs at about
    # 1024x1024 pixels whatever width and height say): given width x height, so the image is the asked size
    max_area_argument: str | None = None
    batches: bool = True  # its call takes a batch of prompts (False: Qwen-Image-Edit and Edit-Plus, one a call)


@dataclass(frozen=True)
class Video:
    """What a video family's pipelines make (Task.TXT2VID / IMG2VID), for one variant of it: the defaults a job that
    gives none runs, and the sizes its pipeline takes. The numbers a loaded pipeline's VAE states (its compression)
    win over these where they differ; these are what requests are checked against before anything loads."""

    temporal: int = 4  # frames per latent frame after the first: a clip has temporal * k + 1 frames (Wan 4, LTX 8)
    spatial: int = 8  # pixels per latent pixel (the VAE's spatial compression: Wan 2.1 8, Wan 2.2 TI2V 16, LTX 32)
    patch: int = 2  # latent pixels per token edge (Wan's (1, 2, 2): 2; LTX 1)
    frames: int = 81  # frames a job that gives none makes
    fps: float = 16.0  # frames per second the clip is saved at when the job gives none
    size: tuple[int, int] = (832, 480)  # (width, height) a job that gives none makes
    # two experts (Wan 2.2 A14B): `transformer` runs the high-noise steps, `transformer_2` the low-noise ones, switched
    # once at the pipeline's boundary_ratio; their own CFG scales (`--cfg`, `--cfg-2`)
    experts: bool = False
    cfg_2: float | None = None  # the low-noise expert's guidance when the job gives none (None: as --cfg)
    # the pipeline takes the init image's first frame (img2vid) only through an image encoder it must have (Wan 2.1
    # I2V's CLIP vision model); False: the VAE alone encodes it (Wan 2.2, LTX)
    image_encoder: bool = False
    # the call's argument naming the frame rate, where the model conditions on it (LTX's `frame_rate`); None: none
    fps_argument: str | None = None
    # the family's IMG2VID pipeline runs over this variant's TXT2VID components (an init image on its text-to-video
    # folder): Wan 2.2 TI2V 5B (WanImageToVideoPipeline with expand_timesteps, no image encoder), LTX-Video
    # (LTXImageToVideoPipeline). False: a T2V folder of it takes no init image (Wan 2.1 T2V, Wan 2.2 T2V A14B)
    img2vid_on_t2v: bool = False
    label: str = ""  # the variant as people name it ("Wan 2.1 T2V"), for messages

    @property
    def size_multiple(self) -> int:
        """Width and height must be multiples of this: the VAE's compression times the patch."""
        return self.spatial * self.patch

    def latent_frames(self, frames: int) -> int:
        """Latent frames a clip of `frames` frames denoises: (frames - 1) / temporal + 1 (Wan: 81 -> 21)."""
        return (int(frames) - 1) // self.temporal + 1


@dataclass(frozen=True)
class SingleFile:
    """How an original-layout single file (A1111 / Civitai / BFL / a GGUF denoiser) of the family is read."""

    pipeline: str  # the diffusers pipeline class `from_single_file` builds
    # diffusers' model types (single_file_utils.infer_diffusers_model_type) its default config may come from;
    # the first is the family's default
    model_types: tuple[str, ...] = ()
    # the components a config folder must have for the file (models/checkpoint.py _COMPONENTS); () = not checked
    components: tuple[str, ...] = ()
    # the denoiser int8/int4 quantize as it loads from the file (None: quantized after the load)
    quantize_on_load: str | None = None
    # a whole checkpoint is this family's, from its {key: shape} (None: not recognised from a whole file)
    checkpoint_match: Callable[[Mapping[str, tuple]], bool] | None = None
    # a GGUF holding the denoiser alone is this family's, from its {key: shape} with the UNet prefix added
    # (None: no GGUF route)
    gguf_match: Callable[[Mapping[str, tuple]], bool] | None = None
    # how a GGUF denoiser's keys become diffusers': 'ldm-unet' (the UNet prefix added, diffusers' converter),
    # 'bfl-flux1' (models/gguf_file.flux_checkpoint, for any width), '' (diffusers' converter as they are)
    gguf_layout: str = ""
    # the file's whole pipeline is checked against the config folder on the meta device before loading
    # (models/checkpoint.py _check_architecture): 'file' (a whole file, and a GGUF's denoiser), 'gguf' (a GGUF's
    # denoiser only) or '' (never)
    architecture_check: str = ""
    # a UNet file may be an inpainting one (9 input channels) with its base model's configs
    inpaint_unet: bool = False
    # where the file keeps each text encoder's weights (prefixes of its keys)
    text_encoder_prefixes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # which shipped config folder (lowvram_gen/configs, models/offline_configs.VARIANTS) fits a whole file, from its
    # {key: shape} and a reader of one tensor's values (or None); None: the family ships no configs for single files
    offline_variant: Callable[..., str] | None = None
    # its T5 encoder and tokenizer, which diffusers lets it run without (None) when no weights are given (SD3's)
    optional_t5: tuple[str, ...] = ()
    # the variant a transformer file is, from its {key: shape}, and the one a components folder's transformer config
    # is, named alike ('FLUX.1 schnell', 'Flux.2 Klein 9B'): a folder of another variant is refused before loading
    # (models/transformer_file.py); None: the family's variants are not told apart
    file_variant: Callable[[Mapping[str, tuple]], str] | None = None
    config_variant: Callable[[Mapping], str] | None = None


@dataclass(frozen=True)
class ControlNetFacts:
    """Which ControlNets fit the family and what diffusers has for them."""

    kind: str  # 'sd' (a UNet's ControlNetModel) | 'sd3' | 'flux': a ControlNet fits a base of the same kind
    model_class: str  # the diffusers ControlNet class
    label: str = ""  # how a refusal names the kind ('' for 'sd': named by cross-attention width, `version_label`)
    # what diffusers' from_transformer sets on top of the transformer's config (planning/controlnet.py)
    from_transformer: Mapping[str, int] = field(default_factory=dict)
    img2img: bool = True  # diffusers has a ControlNet img2img pipeline (SD3 has none)
    guess_mode: bool = True  # A1111's control modes (a UNet ControlNet's residual scales)
    # latent pixels one token of the ControlNet's stream covers, from its config (transformer ControlNets)
    latent_per_token: Callable[[Mapping], int] | None = None
    # a single file's {key: shape} is one of these ControlNets in diffusers' layout (transformer ControlNets; the
    # UNet ones are told apart by their shapes in models/controlnet.py)
    file_match: Callable[[Mapping[str, tuple]], bool] | None = None
    # its ControlNet pipeline VAE-encodes the control image sampling from torch's global random state (SD3's), not
    # from the call's generators: the engine seeds that state from the pass's seed
    global_rng_control_latents: bool = False
    # completes a ControlNet config derived from a file's shapes with what only the base transformer's config says
    # (models/transformer_controlnet.with_base), in place; None: the sizes the base shares (sample size, ...)
    from_base: Callable[[dict, Mapping], None] | None = None
    # the config a single file of this ControlNet gives from its {key: shape} (families/controlnet_shapes.py); None:
    # read by diffusers' own loaders (a UNet's ControlNet)
    config_from_shapes: Callable[[Mapping[str, tuple]], dict] | None = None
    # corrects that config in place from the file's values where its shapes cannot tell (`tensor(key)` reads one
    # tensor: Z-Image's Union 2.0 may carry an unused refiner of zeros, which diffusers reads as 2.0, not 2.1)
    config_from_values: Callable[[dict, Callable[[str], object]], None] | None = None
    # a single file of this family's ControlNet in a layout diffusers does not read ({key: shape}): the one sentence
    # saying what to give instead; None where the file is not one of those
    other_layout: Callable[[Mapping[str, tuple]], str | None] | None = None

  
    # its ControlNets of both kinds (with a conditioning embedding, `input_hint_block`, and without) can run
    # together in one job (False for FLUX.1: FluxMultiControlNetModel reads the control images one way for all)
    mixes_kinds: bool = True
    # its ControlNet pipeline takes control_guidance_start/end (A1111's guidance start/end); False: Z-Image's and
    # SANA's do not, and a unit asking for another window than 0..1 is refused
    guidance_window: bool = True
    # several units run together (diffusers has a multi-ControlNet model for the family); False: one unit a job
    multi: bool = True
    # several units go through diffusers' multi-ControlNet class of this name, which runs the units' control images
    # through ONE ControlNet (a union one: Qwen-Image's QwenImageMultiControlNetModel, which its pipeline does not make
    # of a list itself); None: the pipeline takes a list of ControlNets (SD3's, Flux's)
    multi_union: str | None = None
    # (width, residual streams it hands the transformer) from its config (planning/controlnet.py); None: heads x head
    # width, and num_layers + num_single_layers (SD3's, Flux's, Qwen-Image's, SANA's configs)
    stream: Callable[[Mapping], tuple[int, int]] | None = None
    # the transformer's modules its ControlNet runs on (diffusers' from_transformer puts them on it: Z-Image's
    # embedders and refiners); the engine lends them for each ControlNet forward only, so the memory settings never
    # see the transformer's weights twice (engines/sd/controlnet.lend_transformer)
    borrows: tuple[str, ...] = ()
    # how its ControlNet inpaint pipeline (the record's controlnet_inpaint task) takes the image to repaint and the
    # mask: 'control' (they are the control image and its mask, read by an inpainting ControlNet: Qwen-Image's),
    # 'image' (beside the unit's control map, read by a ControlNet with their input channels: Z-Image's); both
    # repaint the masked area from noise (no strength). None: no ControlNet inpainting
    inpaint: str | None = None
    # a ControlNet of this config reads the image to repaint and its mask (the ones the inpaint pipeline takes), and
    # a published one that does (named in the refusal of another)
    inpaint_model: Callable[[Mapping], bool] | None = None
    inpaint_example: str = ""


def transformer_shape(config: Mapping) -> tuple[int, int]:
    """(hidden width, spatial patch edge) of a transformer denoiser from its config, the layout most diffusers
    transformers share: heads x head width (else hidden_size / inner_dim; 1152, PixArt's, when none is given),
    and `patch_size`, whose spatial part is taken where it is a (t, h, w) triple or an (h, w) pair."""
    heads = int(config.get("num_attention_heads", 0) or 0)
    head_dim = int(config.get("attention_head_dim", 0) or 0)
    hidden = heads * head_dim or int(config.get("hidden_size", 0) or config.get("inner_dim", 0) or 1152)
    return hidden, spatial_patch(config.get("patch_size", 2))


def spatial_patch(patch) -> int:
    """The spatial edge of a patch size: an int as it is, the last entry of a list ([1, 2, 2] -> 2); 2 when unset."""
    if isinstance(patch, (list, tuple)):
        patch = patch[-1] if patch else 2
    return int(patch or 2)


@dataclass(frozen=True)
class Family:
    """One model family: everything the code decides by family, in one place (see the module doc)."""

    key: str  # unique: 'sd15', 'sd21', 'sdxl', 'sd3', 'flux', 'pixart-sigma', ...; 'generic' for the fallback
    # the records that share pipeline classes and loaders ('sd' for SD 1.x and 2.x): prompting's kind, LoadedModel
    group: str
    name: str  # the family in messages: 'SD 1.x/2.x', 'SDXL', 'SD3', 'Flux', ...
    label: str = ""  # the built-in model in the planner's words: 'SD 1.5', 'FLUX.1-dev'
    version_label: str = ""  # a UNet family by its cross-attention width: 'SD 1.x', 'SD 2.x', 'SDXL'

    # --- recognition
    tasks: Mapping[str, str] = field(default_factory=dict)  # Task value -> diffusers pipeline class
    # other pipeline classes of the family (PAG, adapters, instruct-pix2pix ...): recognised, no task of ours
    other_pipelines: tuple[str, ...] = ()
    denoiser: str = "unet"  # the component that runs every step: 'unet' | 'transformer'
    denoiser_classes: tuple[str, ...] = ()  # its diffusers classes
    unet_cross_attention: int = 0  # a UNet family's cross-attention width (768, 1024, 2048); 0: not a UNet one
    single_file: SingleFile | None = None

    # --- names
    builtin: str | None = None  # the shipped config folder (lowvram_gen/configs/<builtin>) `plan` knows offline
    hub_id: str | None = None  # what the short names load
    aliases: tuple[str, ...] = ()  # short names and hub ids `plan` and `--model` take for the built-in model
    native_side: int = 512  # the side it was trained at: `plan`'s default width and height

    # --- shapes and text encoders, for the memory planner
    # (hidden width, spatial patch edge) of its transformer from the transformer's config
    transformer_shape: Callable[[Mapping], tuple[int, int]] = transformer_shape
    # the T5 (non-CLIP) prompt length: the default max_sequence_length of its __call__; None: not known
    t5_tokens: int | None = None
    # text tokens its transformer carries beside the image tokens (joint attention); None: its T5 prompts' sum
    joint_tokens: int | None = None
    cfg_batch: bool = True  # CFG runs as a doubled denoiser batch
    vae_force_upcast: bool = False  # the pipeline honours the VAE config's force_upcast (decodes in float32)
    file_dtype: str = "float16"  # the 16-bit dtype its published checkpoints store (host RAM, half storage)
    controlnet: ControlNetFacts | None = None

    # --- execution side (engines, preview, prompting)
    latent_format: str | None = None  # the preview's latent format key (preview.py FORMATS); None: no preview
    packed_latents: bool = False  # latents are 2x2 patches packed into a sequence (FLUX.1)
    call: Call = Call()
    # our A1111 prompt encoding (weights, 75-token chunks) for its txt2img/img2img pipelines: 'clip' (one CLIP
    # encoder's hidden states: SD 1.x/2.x) | 'clip_pair' (two CLIP encoders side by side, the second's pooled output:
    # SDXL) | None (the pipeline encodes its own prompts)
    prompt_encoding: str | None = None
    clip_skip: bool = False  # A1111's clip skip acts (on its CLIP encoders); elsewhere it is refused / ignored
    variation_seeds: bool = False  # A1111's variation seed and seed resize are made (its noise is a plain tensor)
    # text encoders reloaded per job (text_encoders = 'reloaded'): how its prompts are encoded apart from the call:
    # 'a1111' (our own encoding), 'encode_prompt_cfg' (the pipeline's encode_prompt with CFG and a negative prompt:
    # SD3), 'encode_prompt_pooled' (encode_prompt's embeddings and pooled vector, no negative: FLUX.1),
    # 'encode_prompt_masks' (encode_prompt's embeddings and attention masks, with CFG's negative: SANA, Chroma,
    # Lumina 2), 'encode_prompt_lists' (a list per prompt, the negative always: Z-Image), 'encode_prompt_empty_negative'
    # (the embeddings and those of "", its CFG's negative: Flux.2 Klein), 'encode_prompt_embeds' (the embeddings
    # alone: Flux.2 dev), 'encode_prompt_four' (HiDream's four encoders, the negative's under CFG),
    # 'encode_prompt_pair' (the prompt's and the negative's embeddings of a three-value encode_prompt: Bria),
    # 'encode_prompt_masked' (encode_prompt's embeddings and masks, the negative's apart: Qwen-Image), None: cannot
    text_encode_apart: str | None = None
    # LoRA: 'a1111' (kohya/A1111 keys on the UNet and CLIP encoders, via load_lora_weights), 'diffusers' (the
    # pipeline's own load_lora_weights, its own key formats), None (no LoRA loader)
    lora: str | None = "diffusers"
    # its LoRA loader widens a model layer to fit a wider LoRA (FLUX.1's Control LoRAs): the widths are left to it;
    # elsewhere a LoRA layer of other widths is another model's and refused before loading (networks/lora.py)
    lora_widens: bool = False
    splits_decode: bool = False  # its txt2img call can stop at latents and decode on its own (hires latent upscale)
    # the A1111 sampler the request's sampler "default" runs (with its A1111 Automatic schedule: samplers.py); None:
    # the model folder's own scheduler (flow-matching families: A1111's samplers are for noise prediction)
    default_sampler: str | None = None
    # the steps and CFG scale a request that gives none runs (request.py: None until the Session resolves them):
    # `sampling`, or `sampling_for(facts)` where one pipeline class has variants with other defaults (Z-Image Turbo
    # and base, Flux.2 Klein distilled and base), told apart by what the folder says (FolderFacts)
    sampling: Sampling = A1111_SAMPLING
    sampling_for: Callable[[FolderFacts], Sampling] | None = None

  
    # tasks whose pipeline __call__ takes no width/height: it keeps the init image's size (SD/SDXL img2img); the
    # others are given the pass's size, or they resize the init image to the model's native size (SD3, FLUX.1)
    unsized_tasks: tuple[str, ...] = ()
    # tasks whose pipeline __call__ takes no negative prompt although its txt2img one does (FLUX.1's ControlNet
    # img2img); where `call.takes_negative_prompt` is False no task takes one
    no_negative_prompt_tasks: tuple[str, ...] = ()
    # fixed call arguments a task's pipeline needs to run as our job means it (Task value -> arguments): FLUX.1
    # Kontext's inpaint pipeline resizes the init image to one of its trained resolutions unless `_auto_resize` is
    # False, where our inpaint keeps the size asked, as A1111's does
    task_arguments: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    # config entries a task's pipeline reads off a loaded component whose own config has none (Task value ->
    # component -> entries), set on it (register_to_config, where missing) as that pipeline is made over the loaded
    # components: diffusers 0.42's ChromaInpaintPipeline reads FLUX.1's `guidance_embeds` off Chroma's transformer
    task_configs: Mapping[str, Mapping[str, Mapping[str, object]]] = field(default_factory=dict)
    # its pipelines load textual-inversion embeddings (load_textual_inversion); None: a family no record knows,
    # whose pipeline object is asked
    textual_inversion: bool | None = None
    # how its edit pipeline (tasks' Task.EDIT) takes reference images (None: the family has no edit task)
    edit: Edit | None = None

    # the (width, height) its txt2img pipeline renders when asked for (pipe, width, height), where that is not always
    # the size asked (HiDream scales every size to its native area, keeping the aspect); None: the size asked
    rendered_size: Callable[..., tuple[int, int]] | None = None
    # tasks whose pipeline renders a size of its own whatever width and height it is given (Task value -> (width,
    # height of the image it is given) -> (width, height) it renders): Qwen-Image-Edit's inpaint renders about 1024x1024
    # pixels at the init image's aspect. The plan, the ladder (no resolution step, no preset's cap) and the result's
    # generated size count that one (engines/sd/inpaint.rendered)
    rendered_sizes: Mapping[str, Callable[[int, int], tuple[int, int]]] = field(default_factory=dict)
    # tasks whose pipeline joins the init image's VAE latents to the image tokens in every block, as an edit joins its
    # references (FLUX.1 Kontext's, Flux.2 Klein's and Qwen-Image-Edit's inpaint): the plan counts them beside the
    # image's tokens (engines/sd/inpaint.planned), twice the attention of a txt2img at that size
    joined_init_tasks: tuple[str, ...] = ()
    # a video family (Task.TXT2VID / IMG2VID): what its clips are (`video`), or per variant of one pipeline class, told
    # apart by what the folder says (`video_for`: Wan 2.1, Wan 2.2 TI2V and A14B share WanPipeline). None: images only
    video: Video | None = None
    video_for: Callable[[FolderFacts], Video] | None = None
    # the resolution bins its txt2img pipeline renders a job at, from its transformer's config: ((aspect ratio, height,
    # width), ...) in the pipeline's order; the one whose ratio is nearest the job's runs the denoiser and the decode,
    # and the image is resized to the size asked after (SANA's use_resolution_binning, on by default: 1024 x 1024 for
    # any square job of the 1024 px model). The profile keeps them (models/profile.py) for the estimate. None: none
    resolution_bins: Callable[[Mapping], tuple[tuple[float, int, int], ...]] | None = None

    def default_sampling(self, facts: FolderFacts | None = None) -> Sampling:
        """The steps and CFG scale of a job that gives none, for the folder `facts` describes (None: the record's)."""
        if self.sampling_for is not None:
            return self.sampling_for(facts or FolderFacts())
        return self.sampling

    def video_facts(self, facts: FolderFacts | None = None) -> Video | None:
        """What a clip of the folder `facts` describes is (None: not a video family)."""
        if self.video_for is not None:
            return self.video_for(facts or FolderFacts())
        return self.video

    @property
    def is_video(self) -> bool:
        return self.video is not None or self.video_for is not None

    def takes_negative_prompt(self, task: str | Task = Task.TXT2IMG) -> bool:
        """Whether the pipeline of `task` takes a negative prompt argument at all."""
        return self.call.takes_negative_prompt and Task(task).value not in self.no_negative_prompt_tasks

    def takes_size(self, task: str | Task) -> bool:
        """Whether the pipeline of `task` takes width and height."""
        return Task(task).value not in self.unsized_tasks

    @property
    def pipelines(self) -> tuple[str, ...]:
        """Every pipeline class that is this family's."""
        return (*dict.fromkeys(self.tasks.values()), *self.other_pipelines)

    def pipeline_for(self, task: str | Task) -> str | None:
        """The diffusers pipeline class of `task` (None: the family has no such task)."""
        return self.tasks.get(Task(task).value)

    def has_task(self, task: str | Task) -> bool:
        return Task(task).value in self.tasks

    @property
    def is_generic(self) -> bool:
        return self.key == GENERIC_KEY

    def joint_text_tokens(self, t5_prompts: list[int]) -> int:
        """Text tokens carried beside the image tokens by a transformer with joint attention."""
        return int(self.joint_tokens if self.joint_tokens is not None else sum(t5_prompts))

    def t5_prompt_tokens(self) -> int:
        """The length its T5 (any non-CLIP) encoder's prompts are padded to."""
        return int(self.t5_tokens if self.t5_tokens is not None else DEFAULT_T5_TOKENS)


GENERIC_KEY = "generic"
# A T5 encoder in a pipeline no record knows: its prompts are taken as this long, and a transformer with joint
# attention (a joint_attention_dim in its config) carries them. A guess, not read from anywhere.
DEFAULT_T5_TOKENS = 256
