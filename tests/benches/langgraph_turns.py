"""The LangGraph side of `cargo bench -p keel-tests --bench cli_turn`: LangGraph's prebuilt
ReAct agent with its SQLite checkpointer, against the same scripted server and with the same
tool (the rows of a CSV file whose column count differs from the expected one), all turns in
one process on one thread. Prints one JSON object: the wall time of each turn in ms.

Usage: python langgraph_turns.py BASE_URL TURNS DB_PATH DATA_DIR
"""
import csv
import json
import sqlite3
import sys
import time

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.prebuilt import create_react_agent

url, turns, db_path, data_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]


@tool
def csv_inspect(path: str, expected_columns: int) -> str:
    """Reports the rows of a CSV file whose column count differs from the expected one."""
    real = path.replace("/data", data_dir, 1)
    ragged = []
    with open(real, newline="") as f:
        for line, row in enumerate(csv.reader(f), start=1):
            if len(row) != expected_columns:
                ragged.append({"line": line, "columns": len(row)})
    return json.dumps({"path": path, "ragged_rows": ragged, "ragged_count": len(ragged)})


model = ChatOpenAI(base_url=url, api_key="unused", model="m", max_retries=0)
saver = SqliteSaver(sqlite3.connect(db_path, check_same_thread=False))
agent = create_react_agent(model, [csv_inspect], checkpointer=saver)
config = {"configurable": {"thread_id": "bench"}}
times = []
for i in range(turns):
    started = time.perf_counter()
    out = agent.invoke({"messages": [("user", f"inspect orders.csv, turn {i}")]}, config)
    times.append((time.perf_counter() - started) * 1e3)
    answer = out["messages"][-1].content
    assert "ragged" in answer, answer
print(json.dumps({"turn_ms": times}))
