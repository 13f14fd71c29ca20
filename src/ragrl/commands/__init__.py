"""The ``ragrl`` commands, one module per command group; ``ragrl.cli`` mounts them.

Commands are the top layer: they may use every package below, and nothing imports them but
``ragrl.cli``.
"""
