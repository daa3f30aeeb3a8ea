// Feed mode (`trapd feed`): the protocol readers driven chunk by chunk over stdin/stdout, with no
// sockets, so the harness's unit tests specify the very readers the relay runs.
//
// Commands, one JSON object a line: {"cmd":"session","protocol":..,"armed":[..],"pattern":..,
// "rewrite":{"host:port":"host:port"},"cluster":N} answers {"session":S} (Kafka sessions of one
// cluster number share their transactions); {"cmd":"feed","session":S,"up":true,"data":base64}
// answers {"out":base64,"hits":[{"point":..,"offset":..,"ops":[..]}]}.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
)

type feedCommand struct {
	Cmd      string            `json:"cmd"`
	Protocol string            `json:"protocol"`
	Armed    []string          `json:"armed"`
	Pattern  string            `json:"pattern"`
	Rewrite  map[string]string `json:"rewrite"`
	Cluster  int               `json:"cluster"`
	Session  int               `json:"session"`
	Up       bool              `json:"up"`
	Data     []byte            `json:"data"`
}

type feedHit struct {
	Point  string   `json:"point"`
	Offset int      `json:"offset"`
	Ops    []string `json:"ops"`
}

func feed(in io.Reader, out io.Writer) error {
	enc := json.NewEncoder(out)
	sessions := map[int]Session{}
	clusters := map[int]*KafkaCluster{}
	scanner := bufio.NewScanner(in)
	scanner.Buffer(make([]byte, 64*1024), 64*1024*1024)
	for scanner.Scan() {
		var c feedCommand
		if err := json.Unmarshal(scanner.Bytes(), &c); err != nil {
			return fmt.Errorf("bad command: %v", err)
		}
		reply, err := feedOne(c, sessions, clusters)
		if err != nil {
			reply = map[string]any{"error": err.Error()}
		}
		if err := enc.Encode(reply); err != nil {
			return err
		}
	}
	return scanner.Err()
}

func feedOne(c feedCommand, sessions map[int]Session, clusters map[int]*KafkaCluster) (map[string]any, error) {
	switch c.Cmd {
	case "session":
		var re *regexp.Regexp
		if c.Pattern != "" {
			var err error
			if re, err = regexp.Compile(c.Pattern); err != nil {
				return nil, err
			}
		}
		armed := c.Armed
		find := NewFinder(func() []string { return armed }, re)
		var s Session
		switch c.Protocol {
		case "postgres":
			s = NewPgSession(find)
		case "stomp":
			s = NewStompSession(find)
		case "openwire":
			s = NewOpenWireSession(find)
		case "kafka":
			cluster, ok := clusters[c.Cluster]
			if !ok {
				cluster = NewKafkaCluster(find, c.Rewrite)
				clusters[c.Cluster] = cluster
			}
			s = cluster.Session()
		default:
			return nil, fmt.Errorf("no reader for protocol %q", c.Protocol)
		}
		id := len(sessions) + 1
		sessions[id] = s
		return map[string]any{"session": id}, nil
	case "feed":
		s, ok := sessions[c.Session]
		if !ok {
			return nil, fmt.Errorf("no session %d", c.Session)
		}
		data, hits := s.Feed(c.Up, c.Data)
		found := make([]feedHit, 0, len(hits))
		for _, h := range hits {
			ops := h.Ops
			if ops == nil {
				ops = []string{}
			}
			found = append(found, feedHit{h.Point, h.Offset, ops})
		}
		return map[string]any{"out": data, "hits": found}, nil
	}
	return nil, fmt.Errorf("unknown command %q", c.Cmd)
}
