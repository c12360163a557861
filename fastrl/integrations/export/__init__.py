"""Export of fastrl drafters and learned strategy selection for SGLang and vLLM (no verl, no Ray)."""
