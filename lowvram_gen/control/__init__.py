"""ControlNet units of a request (what the user asked for) and their preprocessors: none and canny need no model;
the model-based ones (control/detectors.py: depth_midas, openpose..., lineart...) run controlnet_aux's detectors,
imported only when a unit asks for one.

No torch here: the request validates its units before anything heavy is imported. Loading is
models/controlnet.py, the memory plan planning/controlnet.py, the run engines/sd/controlnet.py.
"""
