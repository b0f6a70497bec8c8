"""a2d_convert: reference block-diffusion model/decoder and AR to block-diffusion conversion."""

__version__ = "0.1.0"  # kept equal to pyproject.toml; read from here so a source checkout works uninstalled
