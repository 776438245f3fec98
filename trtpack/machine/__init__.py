"""This machine and the deployment targets: GPUs and driver, the packages trtpack uses and
TensorRT, the instance families, what can be built here."""
