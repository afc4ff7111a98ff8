"""Model architectures: each turns a GGUF file into a forward pass over sequence memories."""
