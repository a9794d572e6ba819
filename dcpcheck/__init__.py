"""dcpcheck: differential correctness tests of fused MLA kernels under DCP."""

__version__ = "0.1.0"
