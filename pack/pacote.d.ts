// The part of pacote the packer uses (the package ships no types).
declare module "pacote" {
  interface PacoteOptions {
    integrity?: string;
    cache?: string;
    registry?: string;
    offline?: boolean;
  }
  function tarball(spec: string, options?: PacoteOptions): Promise<Buffer>;
  const pacote: { tarball: typeof tarball };
  export default pacote;
}
