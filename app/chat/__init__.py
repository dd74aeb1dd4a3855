"""Chat: message model, history store (JSONL, atomic writes), streaming view and input box."""
