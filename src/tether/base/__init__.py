"""The lowest layer: errors, fault classification, settings, connections and the other
plumbing every part may use. It imports nothing of Tether above it."""
