"""Adapters that plug fastrl into other systems (verl; SGLang/vLLM export). fastrl's core never imports them."""
