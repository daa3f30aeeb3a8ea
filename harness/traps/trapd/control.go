// The control channel: one JSON object a line in (commands), one a line out (replies carrying the
// command's id, and "fired" events). A harness reaches it on the stack's Toxiproxy (an upgrade of
// `GET /trapd`, server.go) or on the stdin/stdout of `trapd serve`. What a harness made (its trap
// sets, its proxies, the messages they hold) goes when its channel closes, even when the harness
// was killed by SIGKILL, so a trap never outlives its run.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

type command struct {
	ID       int    `json:"id"`
	Cmd      string `json:"cmd"`
	Set      int    `json:"set"`
	Proxy    int    `json:"proxy"`
	Hold     int    `json:"hold"`
	Trap     int    `json:"trap"`
	Point    string `json:"point"`
	Op       string `json:"op"`
	Nth      int    `json:"nth"`
	Release  bool   `json:"release"`
	Protocol string `json:"protocol"`
	Listen   string `json:"listen"`
	Upstream string `json:"upstream"`
	Pattern  string `json:"pattern"`
}

// serve runs one client's control loop until in ends, then drops what the client made.
func (e *Engine) serve(in io.Reader, out io.Writer) error {
	var mu sync.Mutex
	enc := json.NewEncoder(out)
	cl := &client{emit: func(v any) {
		mu.Lock()
		defer mu.Unlock()
		enc.Encode(v) // a harness gone away ends the loop at its next read
	}}
	defer e.drop(cl)
	scanner := bufio.NewScanner(in)
	scanner.Buffer(make([]byte, 64*1024), 16*1024*1024)
	for scanner.Scan() {
		var c command
		if err := json.Unmarshal(scanner.Bytes(), &c); err != nil {
			cl.emit(map[string]any{"id": 0, "error": fmt.Sprintf("bad command %q: %v", scanner.Text(), err)})
			continue
		}
		reply, err := e.run(cl, c)
		if err != nil {
			reply = map[string]any{"error": err.Error()}
		}
		reply["id"] = c.ID
		cl.emit(reply)
	}
	return scanner.Err()
}

func (e *Engine) run(cl *client, c command) (map[string]any, error) {
	switch c.Cmd {
	case "set":
		return map[string]any{"set": e.newSet(cl).id}, nil
	case "decide":
		e.decide(c.Hold, c.Release)
		return map[string]any{}, nil
	case "stop":
		if p := e.proxy(c.Proxy); p != nil && p.set.owner == cl {
			e.stop(p) // a proxy stops once
		}
		return map[string]any{}, nil
	}
	s := e.set(cl, c.Set) // the other commands act on a trap set of this client
	if s == nil {
		return nil, fmt.Errorf("no trap set %d", c.Set)
	}
	switch c.Cmd {
	case "listen":
		if Protocols[c.Protocol] == "" {
			return nil, fmt.Errorf("no trap proxy for protocol %q", c.Protocol)
		}
		p, err := e.listen(s, c.Protocol, c.Listen, c.Upstream, c.Pattern)
		if err != nil {
			return nil, err
		}
		return map[string]any{"proxy": p.id, "address": p.tp.Listen, "route": p.route}, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch c.Cmd {
	case "arm": // the point was checked by the harness (harness.traps.base.POINTS)
		s.armed = append(s.armed, trap{id: c.Trap, point: c.Point, op: c.Op, nth: c.Nth})
	case "disarm":
		s.armed = nil
	case "hits":
		return map[string]any{"hits": s.hits[c.Point]}, nil
	default:
		return nil, fmt.Errorf("unknown command %q", c.Cmd)
	}
	return map[string]any{}, nil
}

// Protocols names the readers a proxy can run.
var Protocols = map[string]string{"postgres": "pg", "stomp": "stomp", "kafka": "kafka", "openwire": "openwire"}

// newServer returns a Toxiproxy API server (not listening) whose proxies log errors only: its
// stderr is the harness's terminal, and Toxiproxy warns of every connection a trap or a test
// closes ("Source terminated"), which is expected here; what a trap does is told on the channel.
func newServer() *toxiproxy.ApiServer {
	logger := zerolog.New(os.Stderr).Level(zerolog.ErrorLevel).With().Timestamp().Logger()
	return toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), logger)
}

func main() {
	var err error
	switch {
	case len(os.Args) > 1 && os.Args[1] == "feed":
		err = feed(os.Stdin, os.Stdout)
	case len(os.Args) > 1 && os.Args[1] == "serve":
		engine = newEngine(newServer(), false) // a private collection: no stack proxy to mirror
		err = engine.serve(os.Stdin, os.Stdout)
	default: // the flags of toxiproxy-server: the stack's Toxiproxy, with traps
		err = serveToxiproxy(os.Args[1:])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "trapd:", err)
		os.Exit(2)
	}
}
