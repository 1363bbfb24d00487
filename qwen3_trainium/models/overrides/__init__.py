"""torchtitan ``@override`` factories, activated by name through ``override.imports``."""
