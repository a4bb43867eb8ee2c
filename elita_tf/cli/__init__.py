"""The command lines: `elita-train`, `elita-compare`, `elita-export`, thin wrappers over the library."""
