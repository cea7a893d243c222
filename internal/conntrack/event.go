package conntrack

import (
	"bytes"
	"encoding/binary"
)

func binarySize(v any) int { return binary.Size(v) }

func decodeEvent(b []byte, ev *ctCtEvent) {
	_ = binary.Read(bytes.NewReader(b), binary.NativeEndian, ev)
}
