"""Issue 30: an inpaint pipeline that joins its init image's latents to the image tokens in every block (FLUX.1
Kontext's, Flux.2 Klein's: `torch.cat([latents, image_latents], dim=1)` in diffusers 0.42's pipelines) is planned as
it runs: at real size, what an edit of one reference image of the same size costs, more than txt2img (the record's
`joined_init_tasks`; Qwen-Image-Edit's, which also renders a size of its own, is in
test_family_qwen_edit_inpaint.py)."""

from __future__ import annotations

import pytest

from lowvram_gen import GenerationRequest
from lowvram_gen.session import Session

from family_checks import inpaint_files  # tests/family_checks.py


@pytest.mark.parametrize("model", ["kontext", "flux2-klein"])
def test_an_inpaint_that_joins_its_init_latents_is_planned_as_an_edit_of_that_size(model, tmp_path):
    from lowvram_gen.hardware.device import simulated

    init, white, _ = inpaint_files(tmp_path, 1024, 1024)
    session = Session()
    profile = session.model_profile(model)
    device = simulated("8GiB")

    def planned(**kw):
        request = GenerationRequest(prompt="a castle", model=model, width=1024, height=1024, steps=20, **kw)
        return {e.name: e.estimate_bytes for e in session.plan(request.validated(), device, profile=profile).estimates
                if (e.width, e.height) == (1024, 1024)}

    inpaint = planned(init_image=str(init), mask=str(white))
    edit = planned(reference_images=(str(init),))
    txt2img = planned()
    same = [name for name in inpaint if name in edit]
    assert same and all(inpaint[name] == edit[name] for name in same)
    both = [name for name in same if name in txt2img]
    # never less than txt2img; more where the denoise is the peak (highvram's peak can be the text encoder's)
    assert all(inpaint[name] >= txt2img[name] for name in both)
    assert inpaint["medvram"] > txt2img["medvram"]
