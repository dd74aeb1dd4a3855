"""Model wrappers over the OpenVINO runtime: target, draft, tokenizer."""
