// The trap toxic: the protocol reader of a connection, first in each direction of a trap proxy.
//
// Toxiproxy runs a toxic per direction; the two halves of one connection share its Session
// (engine.go pairs them). A toxic may be interrupted at any time (another toxic is added to or
// removed from the connection, as a network fault is applied or healed) and run again with the
// same state, so a held message stays in the state, never on the stack of one run.
package main

import (
	"time"

	"github.com/Shopify/toxiproxy/v2/stream"
	"github.com/Shopify/toxiproxy/v2/toxics"
)

// trapToxic is what Toxiproxy builds from the toxic's attributes.
type trapToxic struct {
	Proxy int  `json:"proxy"`
	Up    bool `json:"up"`
}

// half is one direction of one connection.
type half struct {
	conn *conn
	up   bool
	held *held
}

// held is a message a fired trap holds until the harness decides.
type held struct {
	id       int
	data     []byte
	at       time.Time
	decision chan bool
}

func init() {
	toxics.Register(TrapToxic, new(trapToxic))
}

// NewState pairs the direction with its connection; a proxy gone meanwhile gets a pass-through.
func (t *trapToxic) NewState() interface{} {
	if p := engine.proxy(t.Proxy); p != nil {
		return p.half(t.Up)
	}
	return (*half)(nil)
}

// Pipe reads the direction's chunks through the session and forwards them, holding at a firing.
func (t *trapToxic) Pipe(stub *toxics.ToxicStub) {
	h, _ := stub.State.(*half)
	if h == nil {
		new(toxics.NoopToxic).Pipe(stub)
		return
	}
	if h.held != nil && !h.await(stub) {
		return
	}
	for {
		select {
		case <-stub.Interrupt:
			return
		case chunk := <-stub.Input:
			if chunk == nil {
				stub.Close()
				return
			}
			out, hits := h.conn.session.Feed(h.up, chunk.Data)
			if !h.forward(stub, out, hits, chunk.Timestamp) {
				return
			}
		}
	}
}

// forward sends out on, holding it at the first hit that fires a trap; false: the pipe ends.
func (h *half) forward(stub *toxics.ToxicStub, out []byte, hits []Hit, at time.Time) bool {
	for _, hit := range hits {
		t, fired := h.conn.proxy.set.match(hit)
		if !fired {
			continue
		}
		if hit.Offset > 0 {
			stub.Output <- &stream.StreamChunk{Data: out[:hit.Offset], Timestamp: at}
		}
		id, decision := engine.hold(h.conn, t, hit)
		h.held = &held{id: id, data: out[hit.Offset:], at: at, decision: decision}
		return h.await(stub)
	}
	if len(out) > 0 {
		stub.Output <- &stream.StreamChunk{Data: out, Timestamp: at}
	}
	return true
}

// await waits for the decision on the held message: true when it was released and forwarded.
// An interrupt returns false with the message still held: the next run of the toxic waits again.
func (h *half) await(stub *toxics.ToxicStub) bool {
	var release bool
	select {
	case <-stub.Interrupt:
		return false
	case release = <-h.held.decision:
	case <-h.conn.closed:
	case <-h.conn.proxy.gone:
	}
	msg := h.held
	h.held = nil
	engine.forget(msg.id)
	if !release {
		h.conn.close()
		stub.Close() // the link closes its far side; the other direction then ends on its own
		return false
	}
	if len(msg.data) > 0 {
		stub.Output <- &stream.StreamChunk{Data: msg.data, Timestamp: msg.at}
	}
	return true
}
