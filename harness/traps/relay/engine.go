// The relay: listeners in front of Toxiproxy proxies, two pumps per connection, armed traps.
//
// The harness drives it over stdin/stdout (control.go). A trap set is what one run arms: its
// traps and its hit counters are shared by all of its proxies, so "the 2nd COMMIT" counts across
// the instances of a service. When a hit fires a trap, the pump forwards the bytes before the held
// message, tells the harness (a "fired" event with a hold id) and waits for its decision: release
// the message (a frozen process was thawed) or close the connection (after a kill, or a drop).
// The other direction of the connection goes on meanwhile, as the process would see it.
package main

import (
	"errors"
	"io"
	"net"
	"regexp"
	"sync"
	"time"
)

const chunkSize = 256 * 1024

// trap is one armed trap: fire at point on the hit carrying op, or on the nth hit (once).
type trap struct {
	id    int
	point string
	op    string
	nth   int
}

// trapSet is the armed traps and hit counters of one run.
type trapSet struct {
	id    int
	mu    sync.Mutex
	armed []trap
	hits  map[string]int
}

func (s *trapSet) armedOps() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ops []string
	for _, t := range s.armed {
		if t.op != "" {
			ops = append(ops, t.op)
		}
	}
	return ops
}

// match counts hit and returns the trap it fires (disarmed from now on), if any.
func (s *trapSet) match(hit Hit) (trap, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hits[hit.Point]++
	n := s.hits[hit.Point]
	for i, t := range s.armed {
		if t.point != hit.Point {
			continue
		}
		if (t.op != "" && contains(hit.Ops, t.op)) || t.nth == n {
			s.armed = append(s.armed[:i:i], s.armed[i+1:]...)
			return t, true
		}
	}
	return trap{}, false
}

func contains(ops []string, op string) bool {
	for _, o := range ops {
		if o == op {
			return true
		}
	}
	return false
}

// proxy is one listener relaying to its upstream through one protocol's reader.
type proxy struct {
	id       int
	protocol string
	upstream string
	set      *trapSet
	engine   *engine
	listener net.Listener
	finder   Finder
	cluster  *KafkaCluster
	mu       sync.Mutex
	conns    map[int]*conn
	stopped  bool
}

func (p *proxy) session() Session {
	switch p.protocol {
	case "postgres":
		return NewPgSession(p.finder)
	case "stomp":
		return NewStompSession(p.finder)
	default:
		return p.cluster.Session()
	}
}

func (p *proxy) accept() {
	for {
		client, err := p.listener.Accept()
		if err != nil {
			return // closed by stop
		}
		up, err := net.DialTimeout("tcp", p.upstream, 10*time.Second)
		if err != nil {
			client.Close() // the client sees the refusal as a closed connection, as without the trap
			continue
		}
		c := &conn{id: p.engine.next(), proxy: p, client: client, up: up, session: p.session(), closed: make(chan struct{}), left: 2}
		p.mu.Lock()
		if p.stopped {
			p.mu.Unlock()
			c.close()
			return
		}
		p.conns[c.id] = c
		p.mu.Unlock()
		go c.pump(true, client, up)
		go c.pump(false, up, client)
	}
}

func (p *proxy) stop() {
	p.mu.Lock()
	p.stopped = true
	conns := make([]*conn, 0, len(p.conns))
	for _, c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	p.listener.Close()
	for _, c := range conns {
		c.close()
	}
}

func (p *proxy) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

func (p *proxy) forget(id int) {
	p.mu.Lock()
	delete(p.conns, id)
	p.mu.Unlock()
}

// conn is one relayed connection: two pumps sharing one protocol session.
type conn struct {
	id        int
	proxy     *proxy
	client    net.Conn
	up        net.Conn
	session   Session
	closeOnce sync.Once
	closed    chan struct{}
	mu        sync.Mutex
	left      int
}

func (c *conn) close() {
	c.closeOnce.Do(func() {
		close(c.closed)
		c.client.Close()
		c.up.Close()
	})
}

// pump relays src to dst; upward is client -> server.
func (c *conn) pump(upward bool, src, dst net.Conn) {
	defer c.done()
	buf := make([]byte, chunkSize)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			out, hits := c.session.Feed(upward, buf[:n])
			if !c.relay(out, hits, dst) {
				c.close()
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				if tcp, ok := dst.(*net.TCPConn); ok {
					tcp.CloseWrite() // a half-close goes on, as Toxiproxy does
					return
				}
			}
			c.close() // one side went away: end the other, as a plain TCP proxy would
			return
		}
	}
}

// relay writes out to dst, holding it at the first hit that fires a trap; false: close.
func (c *conn) relay(out []byte, hits []Hit, dst net.Conn) bool {
	for _, hit := range hits {
		t, fired := c.proxy.set.match(hit)
		if !fired {
			continue
		}
		if _, err := dst.Write(out[:hit.Offset]); err != nil {
			return false
		}
		if !c.proxy.engine.hold(c, t, hit) {
			return false
		}
		out = out[hit.Offset:]
		break
	}
	_, err := dst.Write(out)
	return err == nil
}

func (c *conn) done() {
	c.mu.Lock()
	c.left--
	last := c.left == 0
	c.mu.Unlock()
	if last {
		c.close()
		c.proxy.forget(c.id)
	}
}

// engine is everything one trapd process serves: trap sets, proxies, held messages.
type engine struct {
	mu      sync.Mutex
	ids     int
	sets    map[int]*trapSet
	proxies map[int]*proxy
	holds   map[int]chan bool
	emit    func(v any)
}

func newEngine(emit func(v any)) *engine {
	return &engine{sets: map[int]*trapSet{}, proxies: map[int]*proxy{}, holds: map[int]chan bool{}, emit: emit}
}

func (e *engine) next() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ids++
	return e.ids
}

func (e *engine) newSet() int {
	s := &trapSet{id: e.next(), hits: map[string]int{}}
	e.mu.Lock()
	e.sets[s.id] = s
	e.mu.Unlock()
	return s.id
}

func (e *engine) set(id int) *trapSet {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.sets[id]
}

func (e *engine) proxy(id int) *proxy {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.proxies[id]
}

// listen starts a proxy of set on address for protocol in front of upstream.
func (e *engine) listen(set *trapSet, protocol, address, upstream, pattern string) (*proxy, error) {
	var re *regexp.Regexp
	if pattern != "" {
		var err error
		if re, err = regexp.Compile(pattern); err != nil {
			return nil, err
		}
	}
	listener, err := net.Listen("tcp", address)
	if err != nil {
		return nil, err
	}
	p := &proxy{id: e.next(), protocol: protocol, upstream: upstream, set: set, engine: e, listener: listener, conns: map[int]*conn{}}
	p.finder = NewFinder(set.armedOps, re)
	if protocol == "kafka" {
		p.cluster = NewKafkaCluster(p.finder, map[string]string{upstream: listener.Addr().String()})
	}
	e.mu.Lock()
	e.proxies[p.id] = p
	e.mu.Unlock()
	go p.accept()
	return p, nil
}

func (e *engine) stop(p *proxy) {
	e.mu.Lock()
	delete(e.proxies, p.id)
	e.mu.Unlock()
	p.stop()
}

// hold tells the harness that t fired on c and waits for its decision: true releases the message.
func (e *engine) hold(c *conn, t trap, hit Hit) bool {
	id := e.next()
	decision := make(chan bool, 1)
	e.mu.Lock()
	e.holds[id] = decision
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		delete(e.holds, id)
		e.mu.Unlock()
	}()
	op := t.op
	if op == "" && len(hit.Ops) > 0 {
		op = hit.Ops[0]
	}
	e.emit(map[string]any{
		"event": "fired", "set": c.proxy.set.id, "trap": t.id, "hold": id, "proxy": c.proxy.id,
		"conn": c.id, "point": hit.Point, "op": op, "ts_ns": time.Now().UnixNano(),
	})
	select {
	case release := <-decision:
		return release
	case <-c.closed:
		return false
	}
}

// decide releases (true) or drops (false) the held message hold; a hold already gone is ignored.
func (e *engine) decide(hold int, release bool) {
	e.mu.Lock()
	decision, ok := e.holds[hold]
	e.mu.Unlock()
	if ok {
		select {
		case decision <- release:
		default:
		}
	}
}
