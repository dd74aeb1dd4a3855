"""Live pyqtgraph plots of what the speculative decoder does, drawn from the GUI thread only."""
