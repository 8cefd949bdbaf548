"""The cost model without a GPU: roofline FLOPs and bytes per path, streaming traffic, kept-token cost and the
kernels' compile report."""
