package main

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// pgServer answers a startup with AuthenticationOk + ReadyForQuery and every Query with
// CommandComplete COMMIT + ReadyForQuery; got receives each Query's text.
func pgServer(t *testing.T) (string, chan string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	got := make(chan string, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				head := make([]byte, 4)
				if _, err := io.ReadFull(c, head); err != nil {
					return
				}
				io.ReadFull(c, make([]byte, binary.BigEndian.Uint32(head)-4))
				c.Write(append(pgMsg('R', []byte{0, 0, 0, 0}), pgMsg('Z', []byte("I"))...))
				for {
					head := make([]byte, 5)
					if _, err := io.ReadFull(c, head); err != nil {
						return
					}
					body := make([]byte, binary.BigEndian.Uint32(head[1:])-4)
					io.ReadFull(c, body)
					got <- strings.TrimRight(string(body), "\x00")
					c.Write(append(pgMsg('C', []byte("COMMIT\x00")), pgMsg('Z', []byte("I"))...))
				}
			}()
		}
	}()
	return ln.Addr().String(), got
}

// trapRig is a standalone engine with one Postgres trap proxy in front of pgServer.
type trapRig struct {
	proxy  *trapProxy
	events chan map[string]any
	got    chan string
}

func newRig(t *testing.T, armed ...trap) *trapRig {
	t.Helper()
	engine = newEngine(newServer(), false)
	upstream, got := pgServer(t)
	events := make(chan map[string]any, 16)
	cl := &client{emit: func(v any) { events <- v.(map[string]any) }}
	set := engine.newSet(cl)
	set.armed = armed
	p, err := engine.listen(set, "postgres", "127.0.0.1:0", upstream, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { engine.drop(cl) })
	return &trapRig{proxy: p, events: events, got: got}
}

// login connects through the trap and finishes the startup.
func (r *trapRig) login(t *testing.T) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", r.proxy.tp.Listen)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	startup := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 8+2), 196608)
	c.Write(append(startup, 0, 0))
	readN(t, c, 5+4+5+1)
	return c
}

func readN(t *testing.T, c net.Conn, n int) []byte {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, n)
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatalf("reading %d bytes: %v", n, err)
	}
	return buf
}

func (r *trapRig) fired(t *testing.T) map[string]any {
	t.Helper()
	select {
	case ev := <-r.events:
		return ev
	case <-time.After(5 * time.Second):
		t.Fatal("no firing")
		return nil
	}
}

func TestAHeldCommitSurvivesToxicsAddedAndRemovedAndIsReleasedOnce(t *testing.T) {
	r := newRig(t, trap{id: 1, point: "pg_before_commit", nth: 1})
	c := r.login(t)
	c.Write(pgMsg('Q', []byte("COMMIT\x00")))
	ev := r.fired(t)
	// A network fault applied and healed while the COMMIT is held interrupts the trap toxic twice.
	toxic := `{"name":"lat","type":"latency","stream":"upstream","attributes":{"latency":0}}`
	if _, err := r.proxy.tp.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
		t.Fatal(err)
	}
	if err := r.proxy.tp.Toxics.RemoveToxic(context.Background(), "lat"); err != nil {
		t.Fatal(err)
	}
	select {
	case q := <-r.got:
		t.Fatalf("the held COMMIT reached the server: %q", q)
	case <-time.After(200 * time.Millisecond):
	}
	engine.decide(int(ev["hold"].(int)), true)
	if q := <-r.got; q != "COMMIT" {
		t.Fatalf("the server got %q", q)
	}
	readN(t, c, 5+7+5+1) // CommandComplete COMMIT, ReadyForQuery
	select {
	case q := <-r.got:
		t.Fatalf("the COMMIT was delivered twice: then %q", q)
	case <-time.After(200 * time.Millisecond):
	}
}

func TestADroppedHoldClosesTheClientsConnection(t *testing.T) {
	r := newRig(t, trap{id: 1, point: "pg_before_commit", nth: 1})
	c := r.login(t)
	c.Write(pgMsg('Q', []byte("COMMIT\x00")))
	engine.decide(int(r.fired(t)["hold"].(int)), false)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatalf("the client read %d bytes after the drop", n)
	}
	if len(r.got) != 0 {
		t.Fatal("the dropped COMMIT reached the server")
	}
}

func TestTheTwoDirectionsOfEachConnectionShareOneSession(t *testing.T) {
	// pg_after_commit fires on the server's confirmation, for the op the client sent upstream:
	// only a downstream half paired with its own upstream half knows the op.
	r := newRig(t, trap{id: 1, point: "pg_after_commit", op: "op-2"})
	conns := []net.Conn{r.login(t), r.login(t), r.login(t)}
	for i, c := range conns {
		c.Write(pgMsg('Q', []byte("INSERT INTO t VALUES ('op-"+string(rune('1'+i))+"'); COMMIT\x00")))
	}
	ev := r.fired(t)
	if ev["op"] != "op-2" {
		t.Fatalf("fired on %v", ev["op"])
	}
	readN(t, conns[0], 5+7+5+1)
	readN(t, conns[2], 5+7+5+1)
	engine.decide(int(ev["hold"].(int)), true)
	readN(t, conns[1], 5+7+5+1)
}

func TestAClientGoneTakesItsProxiesAndHoldsWithIt(t *testing.T) {
	r := newRig(t, trap{id: 1, point: "pg_before_commit", nth: 1})
	c := r.login(t)
	c.Write(pgMsg('Q', []byte("COMMIT\x00")))
	r.fired(t)
	engine.drop(r.proxy.set.owner)
	if _, err := engine.collection.Get(r.proxy.tp.Name); err == nil {
		t.Fatal("the proxy outlived its client")
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("the connection outlived its proxy")
	}
}
