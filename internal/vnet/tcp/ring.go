package tcp

// ring is a byte queue of bounded capacity; the send and receive buffers are rings so a long
// transfer allocates nothing once the ring has grown. It starts small and doubles as data
// needs room, so a thousand idle connections do not each hold megabytes.
type ring struct {
	buf   []byte
	head  int // index of the first byte
	n     int // bytes held
	limit int // capacity the ring may grow to
}

const ringStart = 16 << 10

func newRing(size int) ring {
	return ring{buf: make([]byte, min(size, ringStart)), limit: size}
}

func (r *ring) Len() int  { return r.n }
func (r *ring) Free() int { return r.limit - r.n }
func (r *ring) Cap() int  { return r.limit }

// grow makes room for need bytes in total, keeping the data in order at the start.
func (r *ring) grow(need int) {
	size := len(r.buf)
	for size < need {
		size *= 2
	}
	size = min(size, r.limit)
	nb := make([]byte, size)
	r.ReadAt(nb[:r.n], 0)
	r.buf, r.head = nb, 0
}

// Write appends as much of p as fits.
func (r *ring) Write(p []byte) int {
	n := min(len(p), r.Free())
	if r.n+n > len(r.buf) {
		r.grow(r.n + n)
	}
	tail := (r.head + r.n) % len(r.buf)
	c := copy(r.buf[tail:], p[:n])
	copy(r.buf, p[c:n])
	r.n += n
	return n
}

// ReadAt copies bytes starting off bytes after the head into p without consuming them.
func (r *ring) ReadAt(p []byte, off int) int {
	if off >= r.n {
		return 0
	}
	n := min(len(p), r.n-off)
	start := (r.head + off) % len(r.buf)
	c := copy(p[:n], r.buf[start:])
	copy(p[c:n], r.buf)
	return n
}

// Discard drops n bytes from the head.
func (r *ring) Discard(n int) {
	n = min(n, r.n)
	r.head = (r.head + n) % len(r.buf)
	r.n -= n
	if r.n == 0 {
		r.head = 0
	}
}

// Read consumes into p.
func (r *ring) Read(p []byte) int {
	n := r.ReadAt(p, 0)
	r.Discard(n)
	return n
}
