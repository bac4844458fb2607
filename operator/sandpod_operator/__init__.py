"""sandpod operator: reconciles CodeExecution resources into gVisor sandbox pods."""
