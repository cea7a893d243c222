package conntrack

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
)

// Event is a record of the ring buffer.
type Event struct {
	Time      time.Time `json:"time"`
	Type      string    `json:"type"`
	Proto     string    `json:"proto"`
	State     string    `json:"state,omitempty"`
	Orig      Tuple     `json:"orig"`
	Reply     Tuple     `json:"reply"`
	SeenReply bool      `json:"seen_reply"`
	Assured   bool      `json:"assured"`
}

// Stamped is ev's line with its time first, as conntrack -E -o timestamp prints it:
// "[1700000000.123456]\t[NEW] tcp …" (seconds since the epoch, microseconds).
func (ev Event) Stamped() string {
	us := ev.Time.UnixMicro()
	return fmt.Sprintf("[%d.%06d]\t%s", us/1e6, us%1e6, ev)
}

// String is ev as conntrack -E prints it, but for the timeout, which events do not carry:
// "    [NEW] tcp      6 SYN_SENT src=… [UNREPLIED] src=…".
func (ev Event) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%9s %-8s %d ", "["+ev.Type+"]", ev.Proto, protoNumber(ev.Proto))
	if ev.State != "" {
		b.WriteString(ev.State + " ")
	}
	b.WriteString(ev.Orig.String(ev.Proto) + " ")
	if !ev.SeenReply {
		b.WriteString("[UNREPLIED] ")
	}
	b.WriteString(ev.Reply.String(ev.Proto))
	if ev.Assured {
		b.WriteString(" [ASSURED]")
	}
	return b.String()
}

// EventReader reads the events that happen from the moment it was opened, as conntrack -E
// shows them: those the ring kept while nobody read are skipped.
type EventReader struct {
	rd    *ringbuf.Reader
	since uint64    // CLOCK_MONOTONIC ns (the events' clock, bpf_ktime_get_ns) at opening
	wall  time.Time // the wall clock then, to date the events
}

// OpenEvents opens the event ring of t.
func OpenEvents(t *Tables) (*EventReader, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return nil, fmt.Errorf("read the monotonic clock: %w", err)
	}
	r := &EventReader{since: uint64(ts.Nano()), wall: time.Now()}
	rd, err := ringbuf.NewReader(t.Events)
	if err != nil {
		return nil, fmt.Errorf("open event ring buffer: %w", err)
	}
	r.rd = rd
	return r, nil
}

// Read calls fn for each event until ctx is done, then closes the reader.
func (r *EventReader) Read(ctx context.Context, fn func(Event)) error {
	stop := context.AfterFunc(ctx, func() { r.rd.Close() })
	defer stop()
	defer r.rd.Close()
	var rec ringbuf.Record
	for {
		if err := r.rd.ReadInto(&rec); err != nil {
			if errors.Is(err, os.ErrClosed) || ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("read event: %w", err)
		}
		var ev ctCtEvent
		if len(rec.RawSample) < binary.Size(ev) {
			continue
		}
		_ = binary.Read(bytes.NewReader(rec.RawSample), binary.NativeEndian, &ev)
		if ev.Ts < r.since {
			continue // queued before this reader
		}
		e := toEntry(ev.Key, ctCtEntry{Status: ev.Status, State: ev.State}, false, 0)
		typ := "NEW"
		if ev.Type == uint32(ctCtEventTypeCT_EVENT_DESTROY) {
			typ = "DESTROY"
		}
		out := Event{Time: r.wall.Add(time.Duration(ev.Ts - r.since)), Type: typ, Proto: e.Proto, Orig: e.Orig, Reply: e.Reply,
			SeenReply: e.SeenReply, Assured: e.Assured}
		if e.Proto == "tcp" {
			out.State = e.State
		}
		fn(out)
	}
}
