package lab

import (
	"fmt"
	"hash/fnv"
	"strings"
)

// Kernel object names. Namespaces are "fp-<lab>-<node>": lab names have no dash, so the lab is
// the text between the first two dashes. Interface names must fit 15 bytes, so they carry a
// tag of at most 5 characters derived from the lab name: "fp<tag>-eth0".

const nsPrefix = "fp-"

// Netns is the network namespace of a node.
func Netns(lab, node string) string { return nsPrefix + lab + "-" + node }

// labOfNetns returns the lab a namespace name belongs to, or "".
func labOfNetns(ns string) string {
	rest, ok := strings.CutPrefix(ns, nsPrefix)
	if !ok {
		return ""
	}
	lab, _, ok := strings.Cut(rest, "-")
	if !ok {
		return ""
	}
	return lab
}

// IfName is the kernel name of a node's interface (iface is the topology name, eth0…).
func IfName(lab, iface string) string { return "fp" + tag(lab) + "-" + iface }

func tag(lab string) string {
	if len(lab) <= 5 {
		return lab
	}
	h := fnv.New32a()
	h.Write([]byte(lab))
	return lab[:3] + fmt.Sprintf("%02x", h.Sum32()&0xff)
}
