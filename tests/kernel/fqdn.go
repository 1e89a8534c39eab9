package kernel

import "github.com/nftpolicy/nftpolicy/tests/internal/inproc"

// Agent returns a node's in-process agent (its DNS learning, its runtimes).
func (c *Cluster) Agent(node string) *inproc.Agent { return c.agents[node] }
