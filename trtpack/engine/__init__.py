"""TensorRT engines: the pure parts (plan, provenance, Triton config) and the TensorRT calls.

- ``plan``: profiles as TensorRT shapes, builder settings, timing-cache path, trtexec command
- ``provenance``: ``model.plan.json`` and whether an engine runs on a machine
- ``triton_config``: ``engine_model_config(name, engine_io, profiles, settings)``
- ``tensorrt_api``: the only module importing TensorRT / polygraphy's TensorRT backend

Importing this package imports none of TensorRT, polygraphy, torch or onnxruntime.
"""

from trtpack.engine.plan import BuilderSettings, builder_settings, tensorrt_profiles
from trtpack.engine.provenance import EngineProvenance, provenance_path, runs_here
from trtpack.engine.triton_config import EngineTensor, engine_model_config, engine_model_io

__all__ = [
    "BuilderSettings",
    "EngineProvenance",
    "EngineTensor",
    "builder_settings",
    "engine_model_config",
    "engine_model_io",
    "provenance_path",
    "runs_here",
    "tensorrt_profiles",
]
