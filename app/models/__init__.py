"""Model and device pickers, and the dialog that prepares the embedded default target."""
