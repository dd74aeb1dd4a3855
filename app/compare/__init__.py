"""The comparison panel: target alone vs each draft on a prompt set (engine.bench.runner)."""
