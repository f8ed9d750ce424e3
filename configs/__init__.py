"""Device presets (YAML), installed as package data of deploycc.configs."""
