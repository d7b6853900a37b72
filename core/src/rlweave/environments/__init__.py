"""Built-in environments of multi-turn rollouts (plugin kind ``environment``): ``tools``."""
