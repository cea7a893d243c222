package lab

// Small topologies that tests and benchmarks share.

// HostRouterHost is the topology most tests need: h1 — r1 (router) — h2, addresses assigned
// (h1 198.18.0.1, r1 198.18.0.2 and 198.18.1.1, h2 198.18.1.2; fd00::/64 and fd00:0:0:1::/64).
const HostRouterHost = `
nodes:
  h1: {}
  r1: {kind: router}
  h2: {}
links:
  - endpoints: [h1, r1]
  - endpoints: [r1, h2]
`

// XDPRouter is HostRouterHost with r1 marked as an XDP forwarder (xdp: true): the hosts' veths
// are set up to exchange XDP-redirected frames with it.
const XDPRouter = `
nodes:
  h1: {}
  r1: {kind: router, xdp: true}
  h2: {}
links:
  - endpoints: [h1, r1]
  - endpoints: [r1, h2]
`
