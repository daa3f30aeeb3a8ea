// The trap engine: trap sets, trap proxies and held messages, inside a Toxiproxy server.
//
// A trap proxy is a Toxiproxy proxy with the trap toxic (toxic.go) first in both directions. In
// the stack's Toxiproxy (`trapd -host H -port P`, server.go) a trap proxy in front of one of the
// stack's proxies ("the route") is its twin: it forwards straight to the route's upstream and
// carries the route's toxics and enabled state (server.go mirrors them), so a service's
// connections cross one proxy, as without traps, and still see every network fault. Standalone
// (`trapd serve`, for a trap with no stack) the proxies live in a private collection.
//
// A trap set is what one run arms: its traps and its hit counters are shared by all of its
// proxies, so "the 2nd COMMIT" counts across the instances of a service. When a hit fires a trap,
// the toxic forwards the bytes before the held message, tells the harness that owns the set (a
// "fired" event with a hold id) and waits for its decision: release the message (a frozen process
// was thawed) or close the connection (after a kill, or a drop). The other direction goes on
// meanwhile, as the process would see it.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
)

// TrapToxic is the type name of the trap toxic; the mirror never copies or removes it.
const TrapToxic = "txchaos_trap"

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
	owner *client
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

// client is one harness on the control channel: what it made goes when it goes.
type client struct {
	emit    func(v any)
	sets    []*trapSet
	proxies []*trapProxy
}

// trapProxy is one Toxiproxy proxy whose connections run through the trap toxic.
type trapProxy struct {
	id       int
	protocol string
	route    string // the stack proxy this one mirrors ("" standalone, or in front of a plain address)
	set      *trapSet
	tp       *toxiproxy.Proxy
	finder   Finder
	cluster  *KafkaCluster
	gone     chan struct{} // closed when the proxy is stopped: every hold of it is dropped
	mu       sync.Mutex
	pending  *conn // the connection whose upstream half started and whose downstream half has not
	stopOnce sync.Once
}

// session returns the protocol reader of one more connection.
func (p *trapProxy) session() Session {
	switch p.protocol {
	case "postgres":
		return NewPgSession(p.finder)
	case "stomp":
		return NewStompSession(p.finder)
	case "openwire":
		return NewOpenWireSession(p.finder)
	default:
		return p.cluster.Session()
	}
}

// half returns the state of one direction of a new connection. Toxiproxy starts a connection's
// upstream link and then its downstream link, one connection at a time, on the proxy's accept
// loop: the downstream half pairs with the upstream half started just before it.
func (p *trapProxy) half(up bool) *half {
	p.mu.Lock()
	defer p.mu.Unlock()
	if up || p.pending == nil {
		c := &conn{id: engine.next(), proxy: p, session: p.session(), closed: make(chan struct{})}
		if up {
			p.pending = c
		}
		return &half{conn: c, up: up}
	}
	c := p.pending
	p.pending = nil
	return &half{conn: c, up: false}
}

func (p *trapProxy) stop() {
	p.stopOnce.Do(func() {
		close(p.gone)
		engine.collection.Remove(p.tp.Name) // closes every connection through it
	})
}

// conn is one connection through a trap proxy: its two halves share one protocol session.
type conn struct {
	id        int
	proxy     *trapProxy
	session   Session
	closeOnce sync.Once
	closed    chan struct{}
}

// close makes both halves drop what they hold.
func (c *conn) close() {
	c.closeOnce.Do(func() { close(c.closed) })
}

// Engine is everything one trapd process serves.
type Engine struct {
	server     *toxiproxy.ApiServer
	collection *toxiproxy.ProxyCollection
	mirrors    bool // the collection is the stack's: trap proxies mirror the routes they front
	mu         sync.Mutex
	ids        int
	sets       map[int]*trapSet
	proxies    map[int]*trapProxy
	holds      map[int]chan bool
}

// engine is this process's engine; the trap toxic, built by Toxiproxy from JSON, finds it here.
var engine *Engine

func newEngine(server *toxiproxy.ApiServer, mirror bool) *Engine {
	return &Engine{
		server: server, collection: server.Collection, mirrors: mirror,
		sets: map[int]*trapSet{}, proxies: map[int]*trapProxy{}, holds: map[int]chan bool{},
	}
}

func (e *Engine) next() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ids++
	return e.ids
}

func (e *Engine) newSet(owner *client) *trapSet {
	s := &trapSet{id: e.next(), owner: owner, hits: map[string]int{}}
	e.mu.Lock()
	e.sets[s.id] = s
	owner.sets = append(owner.sets, s)
	e.mu.Unlock()
	return s
}

func (e *Engine) set(owner *client, id int) *trapSet {
	e.mu.Lock()
	defer e.mu.Unlock()
	if s := e.sets[id]; s != nil && s.owner == owner {
		return s
	}
	return nil
}

func (e *Engine) proxy(id int) *trapProxy {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.proxies[id]
}

// route returns the stack proxy listening on address, if the engine mirrors one.
func (e *Engine) route(address string) *toxiproxy.Proxy {
	if !e.mirrors {
		return nil
	}
	for _, p := range e.collection.Proxies() {
		if p.Listen == address && e.twinOf(p.Name) == nil {
			return p
		}
	}
	return nil
}

// twinOf returns the trap proxy named name, if it is one.
func (e *Engine) twinOf(name string) *trapProxy {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, p := range e.proxies {
		if p.tp.Name == name {
			return p
		}
	}
	return nil
}

// twins returns the trap proxies that mirror the stack proxy route.
func (e *Engine) twins(route string) []*trapProxy {
	e.mu.Lock()
	defer e.mu.Unlock()
	var found []*trapProxy
	for _, p := range e.proxies {
		if p.route == route {
			found = append(found, p)
		}
	}
	return found
}

// listen starts a trap proxy of set on address for protocol in front of upstream: the stack
// proxy listening there (its twin, mirrored) or, when none does, the address itself.
func (e *Engine) listen(set *trapSet, protocol, address, upstream, pattern string) (*trapProxy, error) {
	var re *regexp.Regexp
	if pattern != "" {
		var err error
		if re, err = regexp.Compile(pattern); err != nil {
			return nil, err
		}
	}
	target, routeName := upstream, ""
	route := e.route(upstream)
	if route != nil {
		target, routeName = route.Upstream, route.Name
	}
	p := &trapProxy{id: e.next(), protocol: protocol, route: routeName, set: set, gone: make(chan struct{})}
	p.finder = NewFinder(set.armedOps, re)
	p.tp = toxiproxy.NewProxy(e.server, fmt.Sprintf("txchaos-trap-%d", p.id), address, target)
	if err := e.collection.Add(p.tp, false); err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.proxies[p.id] = p
	set.owner.proxies = append(set.owner.proxies, p)
	e.mu.Unlock()
	for _, stream := range []string{"upstream", "downstream"} {
		spec := fmt.Sprintf(`{"name":"%s_%s","type":%q,"stream":%q,"attributes":{"proxy":%d,"up":%t}}`,
			TrapToxic, stream, TrapToxic, stream, p.id, stream == "upstream")
		if _, err := p.tp.Toxics.AddToxicJson(strings.NewReader(spec)); err != nil {
			e.stop(p)
			return nil, err
		}
	}
	if err := p.tp.Start(); err != nil {
		e.stop(p)
		return nil, err
	}
	if protocol == "kafka" { // before any connection: nobody knows the port yet
		p.cluster = NewKafkaCluster(p.finder, map[string]string{upstream: p.tp.Listen})
	}
	if route != nil {
		e.copyRoute(route, p)
	}
	return p, nil
}

// copyRoute gives a new twin the toxics and the enabled state its route has now.
func (e *Engine) copyRoute(route *toxiproxy.Proxy, p *trapProxy) {
	for _, t := range route.Toxics.GetToxicArray() {
		if data, err := json.Marshal(t); err == nil {
			p.tp.Toxics.AddToxicJson(bytes.NewReader(data)) // one already there (a race with the mirror) is fine
		}
	}
	if !route.Enabled {
		p.tp.Stop()
	}
}

func (e *Engine) stop(p *trapProxy) {
	e.mu.Lock()
	delete(e.proxies, p.id)
	e.mu.Unlock()
	p.stop()
}

// drop removes what owner made: its proxies (and their held messages) and its trap sets.
func (e *Engine) drop(owner *client) {
	for _, p := range owner.proxies {
		e.stop(p)
	}
	e.mu.Lock()
	for _, s := range owner.sets {
		delete(e.sets, s.id)
	}
	e.mu.Unlock()
}

// hold tells the harness that t fired on c and returns the channel its decision arrives on.
func (e *Engine) hold(c *conn, t trap, hit Hit) (int, chan bool) {
	id := e.next()
	decision := make(chan bool, 1)
	e.mu.Lock()
	e.holds[id] = decision
	e.mu.Unlock()
	op := t.op
	if op == "" && len(hit.Ops) > 0 {
		op = hit.Ops[0]
	}
	c.proxy.set.owner.emit(map[string]any{
		"event": "fired", "set": c.proxy.set.id, "trap": t.id, "hold": id, "proxy": c.proxy.id,
		"conn": c.id, "point": hit.Point, "op": op, "ts_ns": time.Now().UnixNano(),
	})
	return id, decision
}

func (e *Engine) forget(hold int) {
	e.mu.Lock()
	delete(e.holds, hold)
	e.mu.Unlock()
}

// decide releases (true) or drops (false) the held message hold; a hold already gone is ignored.
func (e *Engine) decide(hold int, release bool) {
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
