"""Hand-written SQuAD cases shared by the scoring tests and those of the `qa-train score` command."""

# SQuAD v1.1's nested layout: two questions of one paragraph, the first with two gold answers.
NESTED = {
    "version": "1.1",
    "data": [
        {
            "title": "Super_Bowl_50",
            "paragraphs": [
                {
                    "context": "Super Bowl 50 was played in Santa Clara, California.",
                    "qas": [
                        {
                            "id": "q1",
                            "question": "Where was Super Bowl 50 played?",
                            "answers": [
                                {"text": "Santa Clara, California", "answer_start": 28},
                                {"text": "Santa Clara", "answer_start": 28},
                            ],
                        },
                        {
                            "id": "q2",
                            "question": "Which Super Bowl?",
                            "answers": [{"text": "50", "answer_start": 11}],
                        },
                    ],
                }
            ],
        }
    ],
}


# SQuAD v2.0: q3 and q4 are unanswerable (no gold answer), each prediction comes with its no-answer probability.
# q5's only gold answer is "The", which normalises to nothing: the official script then scores it against ""
# (so a "" prediction matches), but still counts it as answerable (its file lists an answer).
GOLD = {
    "q1": ["Denver Broncos", "the Broncos"],
    "q2": ["Santa Clara, California"],
    "q3": [],
    "q4": [],
    "q5": ["The"],
    "q6": ["1990"],
}
PREDICTIONS = {"q1": "Broncos", "q2": "Santa Clara", "q3": "", "q4": "Levi's Stadium", "q5": "", "q6": ""}
NA_PROBS = {"q1": 0.1, "q2": 0.5, "q3": 0.9, "q4": 0.3, "q5": 0.7, "q6": 0.95}
