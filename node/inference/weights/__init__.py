"""How weights are read and kept: the GGUF file mapped with its tensors as views (gguf_file),
GGUF tensor types to float (dequant), and the torch weight formats a slice computes with (linear).
Below the architecture families (node.inference.arch) and the slice engine that use them."""
