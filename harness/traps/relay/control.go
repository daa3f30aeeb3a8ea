// The control channel: one JSON object a line on stdin (commands), one a line on stdout (replies
// carrying the command's id, and "fired" events). The harness that started trapd is its only
// client; when its end of stdin closes (the harness exited, even by SIGKILL), trapd exits, so a
// relay never outlives its run.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
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

// serve runs the control loop until stdin ends.
func serve(in io.Reader, out io.Writer) error {
	var mu sync.Mutex
	enc := json.NewEncoder(out)
	emit := func(v any) {
		mu.Lock()
		defer mu.Unlock()
		enc.Encode(v) // a harness gone away ends the loop at its next read of stdin
	}
	e := newEngine(emit)
	scanner := bufio.NewScanner(in)
	scanner.Buffer(make([]byte, 64*1024), 16*1024*1024)
	for scanner.Scan() {
		var c command
		if err := json.Unmarshal(scanner.Bytes(), &c); err != nil {
			emit(map[string]any{"id": 0, "error": fmt.Sprintf("bad command %q: %v", scanner.Text(), err)})
			continue
		}
		reply, err := e.run(c)
		if err != nil {
			reply = map[string]any{"error": err.Error()}
		}
		reply["id"] = c.ID
		emit(reply)
	}
	return scanner.Err()
}

func (e *engine) run(c command) (map[string]any, error) {
	switch c.Cmd {
	case "set":
		return map[string]any{"set": e.newSet()}, nil
	case "decide":
		e.decide(c.Hold, c.Release)
		return map[string]any{}, nil
	case "conns", "stop":
		p := e.proxy(c.Proxy)
		if p == nil {
			return map[string]any{"conns": 0}, nil // a stopped proxy has none, and stops once
		}
		if c.Cmd == "stop" {
			e.stop(p)
		}
		return map[string]any{"conns": p.count()}, nil
	}
	s := e.set(c.Set) // the other commands act on a trap set
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
		return map[string]any{"proxy": p.id, "address": p.listener.Addr().String()}, nil
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
var Protocols = map[string]string{"postgres": "pg", "stomp": "stomp", "kafka": "kafka"}

func main() {
	mode := "serve"
	if len(os.Args) > 1 {
		mode = os.Args[1]
	}
	var err error
	switch mode {
	case "serve":
		err = serve(os.Stdin, os.Stdout)
	case "feed":
		err = feed(os.Stdin, os.Stdout)
	default:
		err = fmt.Errorf("usage: trapd [serve|feed]")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "trapd:", err)
		os.Exit(2)
	}
}
