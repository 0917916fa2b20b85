"""A1111's X/Y/Z plot: one base request, up to three axes of values, a grid of cells run one after another.

- `values`: A1111's value syntax (comma lists read as CSV, `1-5`, `1-10 (+2)`, `1-10 [5]`, their float forms);
- `axes`: the axis records (A1111's names and list order, and ours: Preset, VRAM budget, Quantize), each a way to
  replace a field of the request;
- `grid`: the plan of a grid (every cell's request, validated, capped, planned) before the first cell runs;
- `draw`: the grid PNG with A1111's legends;
- `runner`: the cells through the Session, one at a time, each labelled with its s/step and peak memory.
"""
