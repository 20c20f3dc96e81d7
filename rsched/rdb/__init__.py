"""The Redis layer, the only code that sends commands: keys, scripts, connections and checks."""
