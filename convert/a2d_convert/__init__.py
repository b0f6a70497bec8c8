"""a2d_convert: reference block-diffusion model/decoder and AR to block-diffusion conversion."""
