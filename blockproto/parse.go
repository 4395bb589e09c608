package blockproto

// Check decodes any message strictly, choosing the decoder by opcode, and
// returns its header.
func Check(b []byte) (Header, error) {
	h, err := ParseHeader(b)
	if err != nil {
		return nil, err
	}
	switch op := h.Opcode(); {
	case op == OpLogin:
		_, err = ParseLogin(b)
	case op == OpChallenge:
		_, err = ParseChallenge(b)
	case op == OpProof:
		_, err = ParseProof(b)
	case op == OpWelcome:
		_, err = ParseWelcome(b)
	case op == OpReject || op == OpResponse || op == OpGoodbye:
		_, err = ParseResponse(b)
	case op == OpReady:
		_, err = ParseReady(b)
	case op == OpData:
		_, err = ParseData(b)
	case op == OpExtents:
		_, err = ParseExtents(b, MinInlineUnit)
	case op.IsCommand():
		_, err = ParseCommand(b)
	}
	if err != nil {
		return nil, err
	}
	return h, nil
}
