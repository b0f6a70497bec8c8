// The part of @npmcli/arborist the packer uses (the package ships no types).
declare module "@npmcli/arborist" {
  interface ArboristOptions {
    path: string;
    cache?: string;
    registry?: string;
    offline?: boolean;
    fullMetadata?: boolean;
    ignoreScripts?: boolean;
    binLinks?: boolean;
    audit?: boolean;
    fund?: boolean;
    omit?: string[];
    progress?: boolean;
  }
  interface ReifyOptions {
    omit?: string[];
    save?: boolean;
  }
  export interface Edge {
    name: string;
    /** prod, dev, optional, peer, peerOptional, workspace */
    type: string;
    to: Node | null;
  }
  export interface Node {
    name: string;
    path: string;
    location: string;
    version?: string;
    dev: boolean;
    optional: boolean;
    isLink: boolean;
    children: Map<string, Node>;
    edgesOut: Map<string, Edge>;
    inventory: Map<string, Node>;
    package: { name?: string; version?: string; scripts?: Record<string, string> };
  }
  class Arborist {
    constructor(options: ArboristOptions);
    reify(options?: ReifyOptions): Promise<Node>;
    loadActual(): Promise<Node>;
  }
  export default Arborist;
}
