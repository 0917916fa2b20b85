"""ControlNet units of a request (what the user asked for) and the preprocessors that need no model.

No torch here: the request validates its units before anything heavy is imported. Loading is
models/controlnet.py, the memory plan planning/controlnet.py, the run engines/sd/controlnet.py.
"""
