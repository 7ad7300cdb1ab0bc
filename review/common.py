import os, sys, uuid, logging
ROOT = "/work/wt/review-coll"
sys.path.insert(0, ROOT)
import pymysql
DB = "rvcoll_db"
URL = f"mysql+pymysql://root@127.0.0.1:3306/{DB}"

def conn(db=DB):
    return pymysql.connect(host="127.0.0.1", port=3306, user="root", password="", database=db, autocommit=True, charset="utf8mb4")

def ex(sql, *p, db=DB):
    c = conn(db)
    try:
        with c.cursor() as cur:
            cur.execute(sql, p or None)
            try:
                return list(cur.fetchall())
            except Exception:
                return []
    finally:
        c.close()

def setup():
    c = conn(None)
    with c.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
    c.close()

def sink():
    return f"rv-{uuid.uuid4().hex[:8]}"

def xa_recover():
    return ex("XA RECOVER")

def shadow_tables():
    return ex("SELECT table_schema, table_name FROM information_schema.tables WHERE table_schema LIKE 'rvcoll%%' AND table_name LIKE 'xasink\\_%%'")
