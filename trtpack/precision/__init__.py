"""FP16 and INT8 at the ONNX level (ModelOpt), verified per sample, with an accuracy-driven
fallback: conversion (the shared framework), fp16, int8 and its search, calibration data,
the ModelOpt worker. The precision stage (``trtpack.stages.precision``) runs it."""
