"""Kernel languages (CUDA C, OpenCL C, WGSL): target descriptions and renderers (next issue)."""
