package vnet

import "github.com/flowplane/flowplane/internal/vnet/ipv4"

func checksum(b []byte) uint16 { return ipv4.Checksum(b) }
